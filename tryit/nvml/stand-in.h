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

#define MAX_GPUS 16
#define MAX_ENTRIES 8192
#define MAX_LINKS 18

struct device { int index; };
struct entry { int gpu; char key[64]; char value[192]; int next; };

#define HIDDEN __attribute__((visibility("hidden")))

extern HIDDEN struct device devices[MAX_GPUS];
extern HIDDEN int initialized;
HIDDEN const char *nth(int gpu, const char *key, int n);
HIDDEN const char *get(int gpu, const char *key);
HIDDEN int file_exists(const char *name);
HIDDEN void path_of(char *out, size_t size, const char *name);
HIDDEN nvmlReturn_t scripted(int gpu, const char *key);
HIDDEN int gpu_of(const void *handle);
HIDDEN nvmlReturn_t lookup(const void *handle, const char *key, const char **value);
HIDDEN nvmlReturn_t uint_value(const void *handle, const char *key, unsigned int *out);
HIDDEN nvmlReturn_t ull_value(const void *handle, const char *key, unsigned long long *out);
HIDDEN nvmlReturn_t string_value(const void *handle, const char *key, char *out, unsigned int length);

#endif
