/*
 * The stand-in libnvidia-ml.so.1's shared parts (stand-in.c has the state and most functions,
 * stand-in-events.c the processes, NVLink and events). Helpers are hidden: the library exports
 * NVML's functions only.
 */
#ifndef STEADFAST_NVML_STAND_IN_H
#define STEADFAST_NVML_STAND_IN_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
  OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
  INSUFFICIENT_SIZE = 7, TIMEOUT = 10, GPU_IS_LOST = 15, ARGUMENT_VERSION_MISMATCH = 25, UNKNOWN = 999
};

/*
 * STAND_IN_DRIVER: the driver branch whose symbol set the library exports (built by stand-in.ts
 * with -DSTAND_IN_DRIVER=470 or 450); unset, today's. 470 lacks what R510 and later added
 * (the _v3 process lists, nvmlDeviceGetMemoryInfo_v2, the "clocks event" names, the fabric and
 * versioned temperature calls); 450 also lacks the _v2 process lists (R460).
 */
#ifndef STAND_IN_DRIVER
#define STAND_IN_DRIVER 999
#endif

#define MAX_GPUS 16
#define MAX_ENTRIES 8192
#define MAX_LINKS 36
#define MAX_MIG 8

struct device { int index; };
/* A MIG device: slot `slot` of GPU `gpu`. */
struct mig_device { int gpu; int slot; };
struct entry { int gpu; char key[64]; char value[192]; int next; };

#define HIDDEN __attribute__((visibility("hidden")))

extern HIDDEN struct device devices[MAX_GPUS];
extern HIDDEN struct mig_device mig_devices[MAX_GPUS][MAX_MIG];
extern HIDDEN int initialized;
HIDDEN const char *nth(int gpu, const char *key, int n);
HIDDEN const char *get(int gpu, const char *key);
HIDDEN int file_exists(const char *name);
HIDDEN void path_of(char *out, size_t size, const char *name);
HIDDEN nvmlReturn_t scripted(int gpu, const char *key);
HIDDEN int gpu_of(const void *handle);
HIDDEN const struct mig_device *mig_of(const void *handle);
HIDDEN void reload_state(void);
HIDDEN nvmlReturn_t lookup(const void *handle, const char *key, const char **value);
HIDDEN nvmlReturn_t uint_value(const void *handle, const char *key, unsigned int *out);
HIDDEN nvmlReturn_t ull_value(const void *handle, const char *key, unsigned long long *out);
HIDDEN nvmlReturn_t string_value(const void *handle, const char *key, char *out, unsigned int length);

#endif
