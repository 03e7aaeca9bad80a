/* tests/capi/c_api_workload.c: a whole workload through tensorpool.h from a C99 program, on the
 * simulated device: two streams, record_stream, statistics, a memory fraction, an OOM, sleep and
 * wake, misuse
 * (double free, foreign pointer, NULL handles, bad settings) that must leave the state intact,
 * JSON statistics, a snapshot, and the per-device registry.
 * Usage: c_api_workload SNAPSHOT_PATH. Prints "N passed, M failed"; exit 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorpool/tensorpool.h"

static int sentinel; /* a pointer value that is never the allocator's */
#define NOT_NULL ((void*)&sentinel)

static int passed = 0;
static int failed = 0;

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (cond) {                                                                   \
      ++passed;                                                                   \
    } else {                                                                      \
      ++failed;                                                                   \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__,      \
              __LINE__, #cond, tensorpool_last_error());                          \
    }                                                                             \
  } while (0)

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static void check_intact(tensorpool_allocator* a) { CHECK(tensorpool_check_invariants(a) == TENSORPOOL_OK); }

static tensorpool_stats stats_of(tensorpool_allocator* a) {
  tensorpool_stats s;
  memset(&s, 0, sizeof s);
  CHECK(tensorpool_get_stats(a, &s) == TENSORPOOL_OK);
  return s;
}

static void misuse(tensorpool_allocator* a, void* freed, void* live) {
  int on_stack = 0;
  tensorpool_stats before = stats_of(a), after;
  CHECK(tensorpool_free(a, freed) == TENSORPOOL_ERROR_USAGE); /* double free */
  CHECK(strstr(tensorpool_last_error(), "tensorpool_free") != NULL);
  CHECK(tensorpool_last_status() == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_free(a, &on_stack) == TENSORPOOL_ERROR_USAGE); /* foreign pointer */
  CHECK(tensorpool_record_stream(a, &on_stack, 0) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_free(NULL, live) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(tensorpool_last_error(), "NULL") != NULL);
  CHECK(tensorpool_alloc(a, MiB, 0, NULL) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_set_memory_fraction(a, 1.5) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  after = stats_of(a);
  CHECK(after.all.allocated_bytes.current == before.all.allocated_bytes.current);
  CHECK(after.all.reserved_bytes.current == before.all.reserved_bytes.current);
  CHECK(after.free_calls == before.free_calls);
  check_intact(a);
  CHECK(tensorpool_free(a, live) == TENSORPOOL_OK); /* still usable */
}

static void workload(tensorpool_allocator* a) {
  tensorpool_stream s1 = 0, s2 = 0;
  void* blocks[16];
  size_t requested = 0;
  int i;
  tensorpool_stats s;
  CHECK(tensorpool_create_stream(a, &s1) == TENSORPOOL_OK);
  CHECK(tensorpool_create_stream(a, &s2) == TENSORPOOL_OK);
  CHECK(s1 != s2 && s1 != 0);
  for (i = 0; i < 16; ++i) {
    const size_t bytes = (size_t)(i + 1) * 3 * MiB + 100;
    CHECK(tensorpool_alloc(a, bytes, i % 2 ? s2 : s1, &blocks[i]) == TENSORPOOL_OK);
    CHECK(blocks[i] != NULL);
    requested += bytes;
    check_intact(a);
  }
  s = stats_of(a);
  CHECK(s.all.requested_bytes.current == (int64_t)requested);
  CHECK(s.all.allocations.current == 16);
  CHECK(s.all.allocated_bytes.current >= (int64_t)requested);
  CHECK(s.all.reserved_bytes.current >= s.all.allocated_bytes.current);
  CHECK(s.alloc_calls == 16);

  CHECK(tensorpool_record_stream(a, blocks[0], s2) == TENSORPOOL_OK);
  for (i = 0; i < 16; i += 2) CHECK(tensorpool_free(a, blocks[i]) == TENSORPOOL_OK);
  check_intact(a);
  s = stats_of(a);
  CHECK(s.all.allocations.current == 8);
  CHECK(s.free_calls == 8);

  misuse(a, blocks[0], blocks[1]);
  blocks[1] = NULL;

  /* A memory fraction caps reserved memory: a large request fails, explained. */
  CHECK(tensorpool_set_memory_fraction(a, 0.25) == TENSORPOOL_OK);
  {
    void* big = NOT_NULL;
    CHECK(tensorpool_alloc(a, 600 * MiB, s1, &big) == TENSORPOOL_ERROR_OUT_OF_MEMORY);
    CHECK(big == NULL);
    CHECK(strstr(tensorpool_last_error(), "out of memory") != NULL);
    CHECK(strstr(tensorpool_last_error(), "largest free block") != NULL);
    CHECK(strstr(tensorpool_last_error(), "by stream") != NULL);
    s = stats_of(a);
    CHECK(s.ooms == 1);
    CHECK(s.memory_limit == s.capacity / 4);
    check_intact(a);
  }
  CHECK(tensorpool_set_memory_fraction(a, 1.0) == TENSORPOOL_OK);
  {
    void* zero = NOT_NULL;
    CHECK(tensorpool_alloc(a, 0, s1, &zero) == TENSORPOOL_OK);
    CHECK(zero == NULL);
    CHECK(tensorpool_free(a, NULL) == TENSORPOOL_OK);
  }
  for (i = 3; i < 16; i += 2) CHECK(tensorpool_free(a, blocks[i]) == TENSORPOOL_OK);
  CHECK(tensorpool_empty_cache(a) == TENSORPOOL_OK);
  s = stats_of(a);
  CHECK(s.all.allocated_bytes.current == 0);
  CHECK(s.all.reserved_bytes.current == 0);
  CHECK(s.all.reserved_bytes.peak > 0);
  CHECK(tensorpool_reset_peaks(a) == TENSORPOOL_OK);
  CHECK(stats_of(a).all.reserved_bytes.peak == 0);
  check_intact(a);
}

static void json(tensorpool_allocator* a) {
  size_t needed = 0;
  char small[8];
  char* buffer;
  CHECK(tensorpool_stats_json(a, NULL, 0, &needed) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(needed > 100);
  CHECK(tensorpool_stats_json(a, small, sizeof small, &needed) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  buffer = (char*)malloc(needed + 1);
  CHECK(buffer != NULL);
  if (buffer == NULL) return;
  CHECK(tensorpool_stats_json(a, buffer, needed + 1, NULL) == TENSORPOOL_OK);
  CHECK(strlen(buffer) == needed);
  CHECK(strstr(buffer, "\"allocated_bytes\": {\"all\": {\"current\": ") != NULL);
  CHECK(strstr(buffer, "\"num_ooms\": 1") != NULL);
  free(buffer);
}

/* The number after "key": in the allocator's stats_json (-1: no such key). */
static long long json_count(tensorpool_allocator* a, const char* key) {
  char buffer[8192];
  char pattern[64];
  const char* at;
  if (tensorpool_stats_json(a, buffer, sizeof buffer, NULL) != TENSORPOOL_OK) return -1;
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  at = strstr(buffer, pattern);
  return at == NULL ? -1 : strtoll(at + strlen(pattern), NULL, 10);
}

/* Sleep and wake on the simulated device (virtual memory by default): pages go back, the block
 * keeps its address and says it is asleep, misuse is refused with the state intact; fixed
 * segments refuse to sleep. */
/* Steps around a block that stays: from the third step on, each step is served at the places
 * planned for it (z over x's place, which it did not fit online), with no new memory. The second
 * step remaps idle pages online (a synchronization): its step() maps the hole that left under the
 * plan with the pages above it, so the third step follows the plan (before that trade: the
 * fourth). */
static void steps(void) {
  tensorpool_allocator* a = NULL;
  void *w = NULL, *x = NULL, *y = NULL, *z = NULL;
  void* first_x = NULL;
  tensorpool_stats before;
  int step;
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 2 * GiB, "mode:vmm,vmm_planner:synchronous", &a) ==
        TENSORPOOL_OK);
  if (a == NULL) return;
  CHECK(tensorpool_alloc(a, 64 * MiB, 0, &w) == TENSORPOOL_OK);
  for (step = 0; step < 6; ++step) {
    if (step == 5) before = stats_of(a);
    CHECK(tensorpool_alloc(a, 40 * MiB, 0, &x) == TENSORPOOL_OK);
    CHECK(tensorpool_alloc(a, 40 * MiB, 0, &y) == TENSORPOOL_OK);
    CHECK(tensorpool_free(a, x) == TENSORPOOL_OK);
    CHECK(tensorpool_alloc(a, 60 * MiB, 0, &z) == TENSORPOOL_OK);
    if (step == 0) CHECK(z != x); /* online: above y */
    if (step >= 2) CHECK(z == x);  /* planned */
    if (step == 2) first_x = x;
    if (step > 2) CHECK(x == first_x);
    CHECK(tensorpool_free(a, y) == TENSORPOOL_OK);
    CHECK(tensorpool_free(a, z) == TENSORPOOL_OK);
    CHECK(tensorpool_step(a) == TENSORPOOL_OK);
    check_intact(a);
  }
  CHECK(stats_of(a).device_allocs == before.device_allocs);
  CHECK(stats_of(a).device_maps == before.device_maps);
  CHECK(stats_of(a).syncs == before.syncs);
  /* The four steps served at their planned places; no kept output, no mirror. */
  CHECK(json_count(a, "num_planned_epochs") == 4);
  CHECK(json_count(a, "num_mirrored_steps") == 0);
  CHECK(json_count(a, "num_stitches") == 0);
  CHECK(tensorpool_step(NULL) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_free(a, w) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
}

static void sleep_and_wake(void) {
  tensorpool_allocator *a = NULL, *fixed = NULL;
  tensorpool_sleep_report r, now;
  void *p = NULL, *during = NULL;
  int asleep = -1, on_stack = 0;
  tensorpool_stream s = 0;
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 2 * GiB, NULL, &a) == TENSORPOOL_OK);
  if (a == NULL) return;
  CHECK(tensorpool_wake(a, NULL) == TENSORPOOL_ERROR_USAGE); /* no sleep */
  CHECK(strstr(tensorpool_last_error(), "without sleep()") != NULL);
  CHECK(tensorpool_alloc(a, 10 * MiB, 0, &p) == TENSORPOOL_OK);
  CHECK(tensorpool_sleep(a, NULL, 0, &r) == TENSORPOOL_OK);
  CHECK(r.asleep_blocks == 1 && r.asleep_allocated == 10 * MiB && r.released_bytes >= r.asleep_bytes);
  CHECK(stats_of(a).all.reserved_bytes.current == 0);
  CHECK(tensorpool_is_asleep(a, p, &asleep) == TENSORPOOL_OK && asleep == 1);
  CHECK(tensorpool_is_asleep(a, &on_stack, &asleep) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_create_stream(a, &s) == TENSORPOOL_OK);
  CHECK(tensorpool_record_stream(a, p, s) == TENSORPOOL_ERROR_USAGE);
  CHECK(strstr(tensorpool_last_error(), "asleep") != NULL);
  CHECK(tensorpool_sleep(a, NULL, 0, NULL) == TENSORPOOL_OK); /* again: nothing */
  CHECK(tensorpool_asleep(a, &now) == TENSORPOOL_OK && now.asleep_bytes == r.asleep_bytes);
  CHECK(tensorpool_alloc(a, MiB, 0, &during) == TENSORPOOL_OK && during != p);
  check_intact(a);
  CHECK(tensorpool_wake(a, NULL) == TENSORPOOL_OK);
  CHECK(tensorpool_is_asleep(a, p, &asleep) == TENSORPOOL_OK && asleep == 0);
  CHECK(tensorpool_asleep(a, &now) == TENSORPOOL_OK && now.asleep_bytes == 0);
  CHECK(tensorpool_free(a, p) == TENSORPOOL_OK);
  CHECK(tensorpool_free(a, during) == TENSORPOOL_OK);
  /* a tag sleeps alone */
  CHECK(tensorpool_pop_tag() == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_push_tag("c_api.kv") == TENSORPOOL_OK);
  CHECK(tensorpool_alloc(a, 8 * MiB, 0, &p) == TENSORPOOL_OK);
  CHECK(tensorpool_pop_tag() == TENSORPOOL_OK);
  CHECK(tensorpool_alloc(a, 8 * MiB, 0, &during) == TENSORPOOL_OK);
  CHECK(tensorpool_sleep(a, "c_api.none", 0, &r) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_sleep(a, "c_api.kv", 1, &r) == TENSORPOOL_OK && r.asleep_blocks == 1);
  CHECK(tensorpool_is_asleep(a, p, &asleep) == TENSORPOOL_OK && asleep == 1);
  CHECK(tensorpool_is_asleep(a, during, &asleep) == TENSORPOOL_OK && asleep == 0);
  CHECK(tensorpool_wake(a, "c_api.kv") == TENSORPOOL_OK);
  CHECK(tensorpool_is_asleep(a, p, &asleep) == TENSORPOOL_OK && asleep == 0);
  CHECK(tensorpool_free(a, p) == TENSORPOOL_OK);
  CHECK(tensorpool_free(a, during) == TENSORPOOL_OK);
  check_intact(a);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 2 * GiB, "mode:fixed", &fixed) == TENSORPOOL_OK);
  if (fixed == NULL) return;
  CHECK(tensorpool_sleep(fixed, NULL, 0, &r) == TENSORPOOL_ERROR_USAGE);
  CHECK(strstr(tensorpool_last_error(), "mode:vmm") != NULL);
  CHECK(tensorpool_sleep(NULL, NULL, 0, &r) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_destroy(fixed) == TENSORPOOL_OK);
}

/* CUDA graph capture on the simulated device: a captured stream is served from its pool, a
 * request the pool cannot serve says how much to reserve, misuse is refused with the state
 * intact, and a released pool goes away with its last block. */
static void graph_capture(void) {
  tensorpool_allocator* a = NULL;
  tensorpool_graph_pool pool = 0;
  tensorpool_graph_pool_info info[2];
  size_t count = 9;
  void *p = NULL, *q = NULL;
  tensorpool_stream s = 0;
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 2 * GiB, NULL, &a) == TENSORPOOL_OK);
  if (a == NULL) return;
  CHECK(tensorpool_create_stream(a, &s) == TENSORPOOL_OK);
  CHECK(tensorpool_begin_capture(a, s, 0, &pool) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_begin_capture(a, s, 16 * MiB, &pool) == TENSORPOOL_OK && pool != 0);
  CHECK(tensorpool_alloc(a, 10 * MiB, s, &p) == TENSORPOOL_OK);
  CHECK(tensorpool_alloc(a, 10 * MiB, s, &q) == TENSORPOOL_ERROR_OUT_OF_MEMORY && q == NULL);
  CHECK(strstr(tensorpool_last_error(), "reserve at least") != NULL);
  CHECK(tensorpool_empty_cache(a) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_release_graph(a, pool) == TENSORPOOL_ERROR_USAGE); /* still captured */
  CHECK(tensorpool_graph_pools(a, info, 2, &count) == TENSORPOOL_OK && count == 1);
  CHECK(info[0].id == pool && info[0].reserved >= 16 * MiB && info[0].allocated == 10 * MiB);
  CHECK(info[0].blocks == 1 && info[0].capturing_streams == 1 && info[0].released == 0);
  CHECK(tensorpool_graph_pools(a, NULL, 1, &count) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  check_intact(a);
  CHECK(tensorpool_end_capture(a, s) == TENSORPOOL_OK);
  CHECK(tensorpool_end_capture(a, s) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_join_capture(a, s, pool + 7, 0) == TENSORPOOL_ERROR_USAGE);
  CHECK(tensorpool_release_graph(a, pool) == TENSORPOOL_OK);
  CHECK(tensorpool_graph_pools(a, NULL, 0, &count) == TENSORPOOL_OK && count == 1); /* p is live */
  CHECK(tensorpool_free(a, p) == TENSORPOOL_OK);
  CHECK(tensorpool_graph_pools(a, NULL, 0, &count) == TENSORPOOL_OK && count == 0);
  CHECK(stats_of(a).all.allocated_bytes.current == 0);
  check_intact(a);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
}

static void settings_and_backends(void) {
  tensorpool_allocator* a = (tensorpool_allocator*)NOT_NULL;
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 0, "max_split_size:lots", &a) ==
        TENSORPOOL_ERROR_CONFIG);
  CHECK(a == NULL);
  CHECK(strstr(tensorpool_last_error(), "'max_split_size'") != NULL);
  CHECK(tensorpool_create((tensorpool_backend)42, 0, 0, NULL, &a) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, -1, 0, NULL, &a) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_backend_available(TENSORPOOL_BACKEND_SIMULATED) == 1);
  if (!tensorpool_backend_available(TENSORPOOL_BACKEND_CUDA_VMM)) {
    CHECK(tensorpool_create(TENSORPOOL_BACKEND_CUDA_VMM, 0, 0, NULL, &a) == TENSORPOOL_ERROR_UNAVAILABLE);
    CHECK(strstr(tensorpool_last_error(), "CUDA") != NULL);
  }
  CHECK(tensorpool_destroy(NULL) == TENSORPOOL_OK);
  CHECK(strcmp(tensorpool_status_name(TENSORPOOL_ERROR_USAGE), "TENSORPOOL_ERROR_USAGE") == 0);
  CHECK(tensorpool_api_version() == TENSORPOOL_C_API_VERSION);
}

static void registry(const char* snapshot) {
  tensorpool_allocator *d0 = NULL, *again = NULL, *none = (tensorpool_allocator*)NOT_NULL;
  void *p = NULL, *q = NULL;
  int device = -1;
  tensorpool_backend kind = TENSORPOOL_BACKEND_CUDA_ASYNC;
  CHECK(tensorpool_configure("backend:simulated,bogus_key:1") == TENSORPOOL_ERROR_CONFIG);
  CHECK(strstr(tensorpool_last_error(), "bogus_key") != NULL);
  CHECK(tensorpool_configure("backend:simulated,memory_limit:1GiB") == TENSORPOOL_OK);
  CHECK(tensorpool_existing_device_allocator(3, &none) == TENSORPOOL_OK);
  CHECK(none == NULL);
  CHECK(tensorpool_device_allocator(64, &d0) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(tensorpool_record_history_all(1, 0) == TENSORPOOL_OK);
  CHECK(tensorpool_device_allocator(3, &d0) == TENSORPOOL_OK);
  CHECK(tensorpool_device_allocator(3, &again) == TENSORPOOL_OK);
  CHECK(d0 == again && d0 != NULL);
  CHECK(tensorpool_info(d0, &device, &kind) == TENSORPOOL_OK);
  CHECK(device == 3 && kind == TENSORPOOL_BACKEND_SIMULATED);
  CHECK(tensorpool_alloc(d0, 10 * MiB, 0, &p) == TENSORPOOL_OK);
  CHECK(tensorpool_alloc(d0, 2 * GiB, 0, &q) == TENSORPOOL_ERROR_OUT_OF_MEMORY); /* memory_limit */
  CHECK(tensorpool_configure("backend:simulated") == TENSORPOOL_ERROR_USAGE);         /* too late */
  CHECK(tensorpool_destroy(d0) == TENSORPOOL_ERROR_USAGE);                            /* lives on */
  CHECK(tensorpool_dump_snapshot(snapshot) == TENSORPOOL_OK);
  CHECK(tensorpool_dump_snapshot("/nonexistent-dir/x.pickle") == TENSORPOOL_ERROR_IO);
  CHECK(strstr(tensorpool_last_error(), "nonexistent-dir") != NULL);
  CHECK(tensorpool_free(d0, p) == TENSORPOOL_OK);
  CHECK(tensorpool_empty_cache_all() == TENSORPOOL_OK);
  CHECK(tensorpool_step_all() == TENSORPOOL_OK);
  CHECK(stats_of(d0).all.reserved_bytes.current == 0);
  check_intact(d0);
}

int main(int argc, char** argv) {
  tensorpool_allocator* a = NULL;
  if (argc != 2) {
    fprintf(stderr, "usage: %s SNAPSHOT_PATH\n", argv[0]);
    return 2;
  }
  CHECK(tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 2 * GiB, "max_split_size:none", &a) ==
        TENSORPOOL_OK);
  if (a == NULL) return 1;
  CHECK(tensorpool_record_history(a, 1, 0) == TENSORPOOL_OK);
  workload(a);
  json(a);
  CHECK(tensorpool_write_snapshot(a, argv[1]) == TENSORPOOL_OK);
  CHECK(tensorpool_destroy(a) == TENSORPOOL_OK);
  sleep_and_wake();
  graph_capture();
  settings_and_backends();
  registry(argv[1]);
  steps();
  printf("c_api_workload: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
