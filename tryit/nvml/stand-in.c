/*
 * A stand-in libnvidia-ml.so.1 for machines without an NVIDIA driver: the functions steadfast's
 * NVML source calls, with the signatures and struct layouts of NVIDIA's nvml.h, answering from a
 * scripted GPU state. It lets the agent's FFI path run for real (dlopen, calls on koffi's worker
 * threads, out-parameters, structs, events) in tests and benchmarks.
 *
 * The state lives beside the library: <dir>/state, re-read when it changes (at nvmlInit_v2 and
 * nvmlDeviceGetCount_v2, the start of every poll). One setting per line:
 *
 *   <key> <value>          a system-wide value     driver 580.159.04
 *   <gpu> <key> <value>    a value of GPU <gpu>    0 temp 37
 *
 * A key that is absent answers NVML_ERROR_NOT_SUPPORTED. `<gpu> fail.<key> <code>` makes the
 * call for that key return <code>; `<gpu> hang.<key> 1` makes it block until <dir>/release
 * exists (a hung driver). A key may repeat (processes). `<gpu> lost 1` makes every call on that
 * GPU but its PCI info answer NVML_ERROR_GPU_IS_LOST (a GPU off the bus). Xid events come from
 * <dir>/events, one `xid <gpu> <code>` per line, each delivered once, in order, by
 * nvmlEventSetWait_v2, which re-reads the state too and counts its scripted failures in
 * <dir>/wait-failures.
 *
 * MIG as nvml.h describes it: with `<gpu> mig 1 …`, volatile ECC counters cannot be read through
 * the GPU's handle; `<gpu> mig.max <n>` and `<gpu> migdev.<i> <gpu instance> <compute instance>`
 * give its MIG devices, and `<gpu> migdev.<i>.sram <count>` a MIG device's volatile uncorrectable
 * SRAM count, the one ECC counter a MIG device handle answers.
 *
 * Built with stand-in-events.c (processes, NVLink, events) by tryit/nvml/stand-in.ts with the
 * system's C compiler; not part of any package.
 */
#include "stand-in.h"
#include <stddef.h>

HIDDEN struct device devices[MAX_GPUS];
HIDDEN struct mig_device mig_devices[MAX_GPUS][MAX_MIG];
static struct entry entries[MAX_ENTRIES];
static int entry_count;
/* Chained hash of (gpu, key) -> first entry; entries of one key chain through `next` in file order. */
#define BUCKETS 4096
static int buckets[BUCKETS];

static unsigned int hash_of(int gpu, const char *key) {
  unsigned int h = 2166136261u ^ (unsigned int)(gpu + 1);
  for (; *key != '\0'; key++) h = (h ^ (unsigned char)*key) * 16777619u;
  return h % BUCKETS;
}
HIDDEN int initialized;
static char dir[4096];
static struct timespec state_mtime;
static off_t state_size = -1;
static ino_t state_inode;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char value_buffer[192];

HIDDEN void path_of(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

static void find_dir(void) {
  Dl_info info;
  if (dir[0] != '\0' || dladdr((void *)find_dir, &info) == 0 || info.dli_fname == NULL) return;
  char copy[4096];
  snprintf(copy, sizeof copy, "%s", info.dli_fname);
  snprintf(dir, sizeof dir, "%s", dirname(copy));
}

/*
 * Re-reads <dir>/state when it changed: a new inode (it is replaced by a rename), size or time
 * stamp (file times tick coarsely: two writes within a few ms can share one). Call with the lock held.
 */
static void reload(void) {
  char path[4200];
  struct stat st;
  path_of(path, sizeof path, "state");
  if (stat(path, &st) != 0) { entry_count = 0; state_size = -1; return; }
  if (st.st_ino == state_inode && st.st_size == state_size && st.st_mtim.tv_sec == state_mtime.tv_sec && st.st_mtim.tv_nsec == state_mtime.tv_nsec) return;
  FILE *file = fopen(path, "r");
  if (file == NULL) return;
  state_inode = st.st_ino;
  state_size = st.st_size;
  state_mtime = st.st_mtim;
  entry_count = 0;
  for (int i = 0; i < BUCKETS; i++) buckets[i] = -1;
  char line[512];
  while (fgets(line, sizeof line, file) != NULL && entry_count < MAX_ENTRIES) {
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '\0' || line[0] == '#') continue;
    struct entry *e = &entries[entry_count];
    char *rest = line;
    e->gpu = -1;
    if (line[0] >= '0' && line[0] <= '9') {
      e->gpu = (int)strtol(line, &rest, 10);
      while (*rest == ' ') rest++;
    }
    char *space = strchr(rest, ' ');
    if (space == NULL) continue;
    *space = '\0';
    snprintf(e->key, sizeof e->key, "%s", rest);
    snprintf(e->value, sizeof e->value, "%s", space + 1);
    /* Appended at the end of its chain, so that repeated keys keep the file's order. */
    e->next = -1;
    int *link = &buckets[hash_of(e->gpu, e->key)];
    while (*link != -1) link = &entries[*link].next;
    *link = entry_count;
    entry_count++;
  }
  fclose(file);
}

/* The n-th value of a key (a copy, valid until the next call on this thread), or NULL. */
HIDDEN const char *nth(int gpu, const char *key, int n) {
  const char *found = NULL;
  pthread_mutex_lock(&lock);
  for (int i = entry_count == 0 ? -1 : buckets[hash_of(gpu, key)]; i != -1; i = entries[i].next) {
    if (entries[i].gpu == gpu && strcmp(entries[i].key, key) == 0 && n-- == 0) {
      snprintf(value_buffer, sizeof value_buffer, "%s", entries[i].value);
      found = value_buffer;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

HIDDEN const char *get(int gpu, const char *key) { return nth(gpu, key, 0); }

HIDDEN void reload_state(void) {
  pthread_mutex_lock(&lock);
  reload();
  pthread_mutex_unlock(&lock);
}

HIDDEN int file_exists(const char *name) {
  char path[4200];
  path_of(path, sizeof path, name);
  return access(path, F_OK) == 0;
}

/* What the call for a key answers before its value: a scripted hang, then a scripted failure. */
HIDDEN nvmlReturn_t scripted(int gpu, const char *key) {
  char name[80];
  snprintf(name, sizeof name, "hang.%s", key);
  if (get(gpu, name) != NULL) {
    struct timespec step = {0, 5 * 1000 * 1000};
    while (!file_exists("release")) nanosleep(&step, NULL);
  }
  snprintf(name, sizeof name, "fail.%s", key);
  const char *code = get(gpu, name);
  return code == NULL ? OK : (nvmlReturn_t)atoi(code);
}

HIDDEN int gpu_of(const void *handle) {
  const struct device *d = handle;
  if (d < devices || d >= devices + MAX_GPUS) return -1;
  return d->index;
}

HIDDEN const struct mig_device *mig_of(const void *handle) {
  const struct mig_device *m = handle;
  const struct mig_device *first = &mig_devices[0][0];
  if (m < first || m >= first + MAX_GPUS * MAX_MIG) return NULL;
  return m;
}

/* Looks a GPU's key up: the scripted answer, NOT_SUPPORTED when absent, else OK with *value set. */
HIDDEN nvmlReturn_t lookup(const void *handle, const char *key, const char **value) {
  int gpu = gpu_of(handle);
  if (!initialized) return UNINITIALIZED;
  if (gpu < 0) return INVALID_ARGUMENT;
  if (get(gpu, "lost") != NULL && strcmp(key, "pci") != 0) return GPU_IS_LOST;
  nvmlReturn_t r = scripted(gpu, key);
  if (r != OK) return r;
  *value = get(gpu, key);
  return *value == NULL ? NOT_SUPPORTED : OK;
}

HIDDEN nvmlReturn_t uint_value(const void *handle, const char *key, unsigned int *out) {
  const char *v;
  nvmlReturn_t r = lookup(handle, key, &v);
  if (r == OK) *out = (unsigned int)strtoul(v, NULL, 0);
  return r;
}

HIDDEN nvmlReturn_t ull_value(const void *handle, const char *key, unsigned long long *out) {
  const char *v;
  nvmlReturn_t r = lookup(handle, key, &v);
  if (r == OK) *out = strtoull(v, NULL, 0);
  return r;
}

HIDDEN nvmlReturn_t string_value(const void *handle, const char *key, char *out, unsigned int length) {
  const char *v;
  nvmlReturn_t r = lookup(handle, key, &v);
  if (r != OK) return r;
  if (strlen(v) + 1 > length) return INSUFFICIENT_SIZE;
  snprintf(out, length, "%s", v);
  return OK;
}

/* ---- library ---- */

nvmlReturn_t nvmlInit_v2(void) {
  find_dir();
  reload_state();
  const char *code = get(-1, "fail.init");
  if (code != NULL) return (nvmlReturn_t)atoi(code);
  for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
  initialized = 1;
  return OK;
}

nvmlReturn_t nvmlShutdown(void) {
  if (!initialized) return UNINITIALIZED;
  initialized = 0;
  return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case TIMEOUT: return "Timeout";
    case GPU_IS_LOST: return "GPU is lost";
    case ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
  }
}

static nvmlReturn_t system_string(const char *key, char *out, unsigned int length) {
  if (!initialized) return UNINITIALIZED;
  const char *v = get(-1, key);
  if (v == NULL) return NOT_SUPPORTED;
  if (strlen(v) + 1 > length) return INSUFFICIENT_SIZE;
  snprintf(out, length, "%s", v);
  return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int length) { return system_string("driver", out, length); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *out, unsigned int length) { return system_string("nvml", out, length); }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *out, unsigned int length) {
  char key[40];
  snprintf(key, sizeof key, "procname.%u", pid);
  nvmlReturn_t r = system_string(key, out, length);
  return r == NOT_SUPPORTED ? NOT_FOUND : r;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialized) return UNINITIALIZED;
  reload_state();
  nvmlReturn_t r = scripted(-1, "gpus");
  if (r != OK) return r;
  const char *v = get(-1, "gpus");
  *count = v == NULL ? 0 : (unsigned int)atoi(v);
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
  if (!initialized) return UNINITIALIZED;
  if (index >= MAX_GPUS) return INVALID_ARGUMENT;
  nvmlReturn_t r = scripted((int)index, "handle");
  if (r != OK) return r;
  *device = &devices[index];
  return OK;
}

/* ---- identity ---- */

typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
  const char *v;
  nvmlReturn_t r = lookup(device, "pci", &v);
  if (r != OK) return r;
  memset(pci, 0, sizeof *pci);
  snprintf(pci->busId, sizeof pci->busId, "%s", v);
  snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", strlen(v) > 4 ? v + 4 : v);
  unsigned int domain = 0, bus = 0, dev = 0;
  sscanf(v, "%x:%x:%x", &domain, &bus, &dev);
  pci->domain = domain;
  pci->bus = bus;
  pci->device = dev;
  return OK;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *out, unsigned int length) { return string_value(device, "uuid", out, length); }
nvmlReturn_t nvmlDeviceGetName(void *device, char *out, unsigned int length) { return string_value(device, "name", out, length); }
nvmlReturn_t nvmlDeviceGetMinorNumber(void *device, unsigned int *minor) { return uint_value(device, "minor", minor); }

static nvmlReturn_t uint_pair(void *device, const char *key, unsigned int *a, unsigned int *b) {
  const char *v;
  nvmlReturn_t r = lookup(device, key, &v);
  if (r == OK && sscanf(v, "%u %u", a, b) != 2) return UNKNOWN;
  return r;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) { return uint_pair(device, "mig", current, pending); }

/* nvmlDeviceArchitecture_t: 4 Pascal, 5 Volta, 6 Turing, 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell. */
nvmlReturn_t nvmlDeviceGetArchitecture(void *device, unsigned int *arch) { return uint_value(device, "arch", arch); }

static int mig_on(void *device) {
  const char *v;
  unsigned int current = 0;
  return lookup(device, "mig", &v) == OK && sscanf(v, "%u", &current) == 1 && current == 1;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count) { return uint_value(device, "mig.max", count); }

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **mig) {
  char key[32];
  const char *v;
  if (index >= MAX_MIG) return INVALID_ARGUMENT;
  snprintf(key, sizeof key, "migdev.%u", index);
  nvmlReturn_t r = lookup(device, key, &v);
  if (r != OK) return r == NOT_SUPPORTED ? NOT_FOUND : r;
  int gpu = gpu_of(device);
  mig_devices[gpu][index].gpu = gpu;
  mig_devices[gpu][index].slot = (int)index;
  *mig = &mig_devices[gpu][index];
  return OK;
}

/* The n-th number of a MIG device's `migdev.<slot>` line (0: GPU instance, 1: compute instance). */
static nvmlReturn_t mig_id(void *handle, int n, unsigned int *id) {
  const struct mig_device *m = mig_of(handle);
  if (!initialized) return UNINITIALIZED;
  if (m == NULL) return INVALID_ARGUMENT;
  char key[32];
  snprintf(key, sizeof key, "migdev.%d", m->slot);
  const char *v = get(m->gpu, key);
  unsigned int ids[2];
  if (v == NULL || sscanf(v, "%u %u", &ids[0], &ids[1]) != 2) return NOT_FOUND;
  *id = ids[n];
  return OK;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned int *id) { return mig_id(device, 0, id); }
nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned int *id) { return mig_id(device, 1, id); }

/* ---- health readings ---- */

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
  return sensor == 0 ? uint_value(device, "temp", temp) : INVALID_ARGUMENT;
}

#if STAND_IN_DRIVER >= 510
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;

nvmlReturn_t nvmlDeviceGetTemperatureV(void *device, nvmlTemperature_v1_t *t) {
  if (t->version != (unsigned int)(sizeof(nvmlTemperature_v1_t) | (1u << 24))) return ARGUMENT_VERSION_MISMATCH;
  if (t->sensorType != 0) return INVALID_ARGUMENT;
  unsigned int temp;
  nvmlReturn_t r = uint_value(device, "temp", &temp);
  if (r == OK) t->temperature = (int)temp;
  return r;
}
#endif

typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  unsigned long long value;
} nvmlFieldValue_t;

nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
  if (!initialized) return UNINITIALIZED;
  if (gpu_of(device) < 0 || count < 0) return INVALID_ARGUMENT;
  for (int i = 0; i < count; i++) {
    char key[32];
    snprintf(key, sizeof key, "field.%u", values[i].fieldId);
    values[i].valueType = 3; /* unsigned long long */
    values[i].nvmlReturn = ull_value(device, key, &values[i].value);
  }
  return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *milliwatts) { return uint_value(device, "power", milliwatts); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *device, unsigned int *milliwatts) { return uint_value(device, "power.limit", milliwatts); }

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
  return uint_pair(device, "util", &utilization->gpu, &utilization->memory);
}

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

/* "memory <total> <reserved> <used> <free>" in bytes, as nvidia-smi's fb_memory_usage lists them. */
static nvmlReturn_t memory(void *device, unsigned long long *total, unsigned long long *reserved, unsigned long long *used, unsigned long long *free_) {
  const char *v;
  nvmlReturn_t r = lookup(device, "memory", &v);
  if (r == OK && sscanf(v, "%llu %llu %llu %llu", total, reserved, used, free_) != 4) return UNKNOWN;
  return r;
}

#if STAND_IN_DRIVER >= 510
/* `<gpu> fail.memory.v2 <code>` fails this call alone (a driver whose v2 call errs where v1 answers). */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *out) {
  if (out->version != (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24))) return ARGUMENT_VERSION_MISMATCH;
  int gpu = gpu_of(device);
  nvmlReturn_t r = gpu < 0 ? INVALID_ARGUMENT : scripted(gpu, "memory.v2");
  if (r != OK) return r;
  return memory(device, &out->total, &out->reserved, &out->used, &out->free);
}
#endif

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *out) {
  unsigned long long reserved;
  nvmlReturn_t r = memory(device, &out->total, &reserved, &out->used, &out->free);
  if (r == OK) out->used += reserved;
  return r;
}

/* errorType 0 corrected / 1 uncorrected; counterType 0 volatile / 1 aggregate; location as nvml.h numbers them. */
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(void *device, int errorType, int counterType, int location, unsigned long long *count) {
  char key[48];
  const struct mig_device *m = mig_of(device);
  if (m != NULL) {
    /* A MIG device answers its volatile uncorrectable counts outside DRAM, nothing else. */
    if (!initialized) return UNINITIALIZED;
    if (errorType != 1 || counterType != 0 || location == 2) return NOT_SUPPORTED;
    snprintf(key, sizeof key, "migdev.%d.sram", m->slot);
    const char *v = get(m->gpu, key);
    if (v == NULL) return NOT_SUPPORTED;
    *count = strtoull(v, NULL, 0);
    return OK;
  }
  if (counterType == 0 && mig_on(device)) return NOT_SUPPORTED;
  snprintf(key, sizeof key, "ecc.%d.%d.%d", errorType, counterType, location);
  return ull_value(device, key, count);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned int *corrected, unsigned int *uncorrected, unsigned int *pending, unsigned int *failure) {
  const char *v;
  nvmlReturn_t r = lookup(device, "remapped", &v);
  if (r == OK && sscanf(v, "%u %u %u %u", corrected, uncorrected, pending, failure) != 4) return UNKNOWN;
  return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(void *device, int cause, unsigned int *pageCount, unsigned long long *addresses) {
  char key[32];
  unsigned int count;
  snprintf(key, sizeof key, "retired.%d", cause);
  nvmlReturn_t r = uint_value(device, key, &count);
  if (r != OK) return r;
  unsigned int room = *pageCount;
  *pageCount = count;
  if (count > room) return INSUFFICIENT_SIZE;
  for (unsigned int i = 0; i < count && addresses != NULL; i++) addresses[i] = 0x1000ull * (i + 1);
  return OK;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *device, unsigned int *pending) { return uint_value(device, "retired.pending", pending); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *device, unsigned int *gen) { return uint_value(device, "pcie.gen", gen); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *device, unsigned int *width) { return uint_value(device, "pcie.width", width); }
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(void *device, unsigned int *count) { return uint_value(device, "pcie.replays", count); }

nvmlReturn_t nvmlDeviceGetClockInfo(void *device, int type, unsigned int *mhz) {
  char key[24];
  snprintf(key, sizeof key, "clock.%d", type);
  return uint_value(device, key, mhz);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(void *device, int type, unsigned int *mhz) {
  char key[24];
  snprintf(key, sizeof key, "maxclock.%d", type);
  return uint_value(device, key, mhz);
}

#if STAND_IN_DRIVER >= 510
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *reasons) { return ull_value(device, "clock.reasons", reasons); }
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(void *device, unsigned long long *reasons) { return ull_value(device, "clock.reasons.supported", reasons); }
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *reasons) { return ull_value(device, "clock.reasons", reasons); }
nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(void *device, unsigned long long *reasons) { return ull_value(device, "clock.reasons.supported", reasons); }

typedef struct {
  unsigned char clusterUuid[16];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;
} nvmlGpuFabricInfo_t;

#if STAND_IN_DRIVER >= 510
/* "fabric <state> <status>": state 0 not supported, 1 not started, 2 in progress, 3 completed. */
static nvmlReturn_t fabric(void *device, unsigned char *state, nvmlReturn_t *status) {
  const char *v;
  nvmlReturn_t r = lookup(device, "fabric", &v);
  if (r != OK) return r;
  unsigned int s = 0;
  if (sscanf(v, "%u %d", &s, status) != 2) return UNKNOWN;
  *state = (unsigned char)s;
  return OK;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
  memset(info, 0, sizeof *info);
  return fabric(device, &info->state, &info->status);
}

typedef struct {
  unsigned int version;
  unsigned char clusterUuid[16];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;
  unsigned int healthMask;
  unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

/* Versions 2 (36 bytes) and 3 (40); `<gpu> fabric.version 2` makes a driver that knows version 2 only. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, nvmlGpuFabricInfo_v3_t *info) {
  unsigned int v3 = (unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3u << 24));
  unsigned int v2 = (unsigned int)(offsetof(nvmlGpuFabricInfo_v3_t, healthSummary) | (2u << 24));
  const char *newest = gpu_of(device) < 0 ? NULL : get(gpu_of(device), "fabric.version");
  int known = newest == NULL ? 3 : atoi(newest);
  if (!(info->version == v2 || (info->version == v3 && known >= 3))) return ARGUMENT_VERSION_MISMATCH;
  unsigned int version = info->version;
  memset(info, 0, version == v3 ? sizeof *info : offsetof(nvmlGpuFabricInfo_v3_t, healthSummary));
  info->version = version;
  return fabric(device, &info->state, &info->status);
}
#endif

