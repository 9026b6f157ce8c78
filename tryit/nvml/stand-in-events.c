/* The stand-in libnvidia-ml.so.1 (see stand-in.c): processes, NVLink and Xid events. */
#include "stand-in.h"

/* ---- processes ---- */

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlProcessInfo_v1_t, the struct of the calls without a suffix (before R460). */
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* "proc.<kind> <pid> <bytes>", one line per process; `v1` fills the 16-byte struct, else the 24-byte one. */
static nvmlReturn_t processes(void *device, const char *kind, unsigned int *count, void *out, int v1) {
  int gpu = gpu_of(device);
  if (!initialized) return UNINITIALIZED;
  if (gpu < 0) return INVALID_ARGUMENT;
  char key[32];
  snprintf(key, sizeof key, "proc.%s", kind);
  nvmlReturn_t r = scripted(gpu, key);
  if (r != OK) return r;
  unsigned int n = 0;
  while (nth(gpu, key, (int)n) != NULL) n++;
  unsigned int room = *count;
  *count = n;
  if (n > room) return INSUFFICIENT_SIZE;
  for (unsigned int i = 0; i < n; i++) {
    unsigned int pid = 0;
    unsigned long long bytes = 0;
    sscanf(nth(gpu, key, (int)i), "%u %llu", &pid, &bytes);
    if (v1) {
      nvmlProcessInfo_v1_t *infos = out;
      infos[i].pid = pid;
      infos[i].usedGpuMemory = bytes;
      continue;
    }
    nvmlProcessInfo_t *infos = out;
    infos[i].pid = pid;
    infos[i].usedGpuMemory = bytes;
    infos[i].gpuInstanceId = 0xFFFFFFFFu;
    infos[i].computeInstanceId = 0xFFFFFFFFu;
  }
  return OK;
}

#if STAND_IN_DRIVER >= 510
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos) { return processes(device, "compute", count, infos, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos) { return processes(device, "graphics", count, infos, 0); }
#endif
#if STAND_IN_DRIVER >= 460
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *device, unsigned int *count, nvmlProcessInfo_t *infos) { return processes(device, "compute", count, infos, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(void *device, unsigned int *count, nvmlProcessInfo_t *infos) { return processes(device, "graphics", count, infos, 0); }
#endif
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device, unsigned int *count, nvmlProcessInfo_v1_t *infos) { return processes(device, "compute", count, infos, 1); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(void *device, unsigned int *count, nvmlProcessInfo_v1_t *infos) { return processes(device, "graphics", count, infos, 1); }

/* ---- NVLink ---- */

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, unsigned int *active) {
  char key[24];
  if (link >= MAX_LINKS) return INVALID_ARGUMENT;
  snprintf(key, sizeof key, "nvlink.%u", link);
  return uint_value(device, key, active);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter, unsigned long long *value) {
  char key[32];
  if (link >= MAX_LINKS) return INVALID_ARGUMENT;
  snprintf(key, sizeof key, "nvlink.%u.%d", link, counter);
  return ull_value(device, key, value);
}

/* ---- events ---- */

typedef struct {
  void *device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

struct event_set { unsigned long long registered[MAX_GPUS]; long delivered; };

nvmlReturn_t nvmlEventSetCreate(struct event_set **set) {
  if (!initialized) return UNINITIALIZED;
  nvmlReturn_t r = scripted(-1, "eventset");
  if (r != OK) return r;
  *set = calloc(1, sizeof **set);
  return *set == NULL ? UNKNOWN : OK;
}

nvmlReturn_t nvmlEventSetFree(struct event_set *set) {
  free(set);
  return OK;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) { return ull_value(device, "events", types); }

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, struct event_set *set) {
  unsigned long long supported;
  nvmlReturn_t r = ull_value(device, "events", &supported);
  if (r != OK) return r;
  if ((types & ~supported) != 0) return NOT_SUPPORTED;
  set->registered[gpu_of(device)] |= types;
  return OK;
}

/* The next undelivered line of <dir>/events for a registered GPU, or 0 when none. */
static int next_event(struct event_set *set, nvmlEventData_t *data) {
  char path[4200], line[128];
  path_of(path, sizeof path, "events");
  FILE *file = fopen(path, "r");
  if (file == NULL) return 0;
  long index = 0;
  int found = 0;
  while (fgets(line, sizeof line, file) != NULL) {
    if (index++ < set->delivered) continue;
    set->delivered = index;
    int gpu = -1;
    unsigned long long code = 0;
    if (sscanf(line, "xid %d %llu", &gpu, &code) != 2 || gpu < 0 || gpu >= MAX_GPUS) continue;
    if ((set->registered[gpu] & 0x8ull) == 0) continue;
    data->device = &devices[gpu];
    data->eventType = 0x8ull; /* nvmlEventTypeXidCriticalError */
    data->eventData = code;
    data->gpuInstanceId = 0xFFFFFFFFu;
    data->computeInstanceId = 0xFFFFFFFFu;
    found = 1;
    break;
  }
  fclose(file);
  return found;
}

/* Counts a scripted failure of the wait in <dir>/wait-failures, so that a test can see how often it was asked. */
static void count_wait_failure(void) {
  static long failures;
  char path[4200];
  path_of(path, sizeof path, "wait-failures");
  FILE *file = fopen(path, "w");
  if (file == NULL) return;
  fprintf(file, "%ld\n", ++failures);
  fclose(file);
}

nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, nvmlEventData_t *data, unsigned int timeoutms) {
  if (!initialized) return UNINITIALIZED;
  reload_state();
  nvmlReturn_t r = scripted(-1, "wait");
  if (r != OK) {
    count_wait_failure();
    return r;
  }
  struct timespec step = {0, 5 * 1000 * 1000};
  for (unsigned int waited = 0;; waited += 5) {
    if (next_event(set, data)) return OK;
    if (waited >= timeoutms) return TIMEOUT;
    nanosleep(&step, NULL);
  }
}
