/* libckpt C API: mirrors ckpt/client.h for bindings from other languages.
 *
 * Every function returns a ckpt_status code (CKPT_OK = 0, otherwise one of
 * the codes below, the absl::StatusCode values); the message of the last
 * failure on the calling thread is available from ckpt_last_error(). No C++
 * exception ever leaves a function of this header: one that escapes the
 * library (allocation failure included) becomes CKPT_INTERNAL with a message
 * naming the function. A ckpt_client may be used from several threads; a
 * ckpt_save_handle from one.
 */
#ifndef CKPT_CKPT_H_
#define CKPT_CKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every code the library returns. The daemon's answers travel as gRPC
 * status codes, which are these same values. */
typedef int ckpt_status;
enum {
  CKPT_OK = 0,
  /* The operation was cancelled: a save queued while the client closes. */
  CKPT_CANCELLED = 1,
  /* An error the daemon or the transport could not classify. */
  CKPT_UNKNOWN = 2,
  /* A bad argument or option; the message names it. */
  CKPT_INVALID_ARGUMENT = 3,
  /* A wait ran out of time (ckpt_wait_durable, a busy daemon). */
  CKPT_DEADLINE_EXCEEDED = 4,
  /* No such job, step, tensor or file. */
  CKPT_NOT_FOUND = 5,
  /* The step (or job) exists already, e.g. a save of a step not newer
   * than the last one. */
  CKPT_ALREADY_EXISTS = 6,
  /* The daemon or the file system refused this caller (another uid). */
  CKPT_PERMISSION_DENIED = 7,
  /* No free slot (block_when_busy = 0), no shared memory, a slot too small,
   * a limit of the daemon. */
  CKPT_RESOURCE_EXHAUSTED = 8,
  /* The call needs another state: e.g. a device tensor without CUDA, a
   * rank not registered. */
  CKPT_FAILED_PRECONDITION = 9,
  /* A race lost to another party (an arena replaced while attaching, a
   * lease taken over); retrying may succeed. */
  CKPT_ABORTED = 10,
  /* A value past a limit of the protocol (a step or size out of range). */
  CKPT_OUT_OF_RANGE = 11,
  /* The daemon does not implement the call (an older ckptd). */
  CKPT_UNIMPLEMENTED = 12,
  /* A broken invariant, or a C++ exception caught at this API. */
  CKPT_INTERNAL = 13,
  /* The daemon cannot be reached; retrying later may succeed. */
  CKPT_UNAVAILABLE = 14,
  /* Stored bytes are lost or corrupt: a checksum mismatch, a short file. */
  CKPT_DATA_LOSS = 15,
  /* The transport could not authenticate the caller. */
  CKPT_UNAUTHENTICATED = 16,
};

/* Same values as ckpt::DType. */
typedef enum {
  CKPT_FLOAT32 = 1,
  CKPT_FLOAT16 = 2,
  CKPT_BFLOAT16 = 3,
  CKPT_FLOAT64 = 4,
  CKPT_INT8 = 5,
  CKPT_UINT8 = 6,
  CKPT_INT16 = 7,
  CKPT_INT32 = 8,
  CKPT_INT64 = 9,
  CKPT_BOOL = 10,
} ckpt_dtype;

typedef struct {
  const char* name;
  ckpt_dtype dtype;
  int ndim;
  const int64_t* shape;
  void* data;
  int device; /* -1 = host, N >= 0 = cuda:N */
} ckpt_tensor;

/* Where a tensor sits in a global tensor (ckpt::TensorLayout,
 * doc/resharding.md): the tensor is the box [offsets, offsets + shape) of
 * a tensor of global_shape; both arrays have the tensor's ndim entries. */
typedef struct {
  const int64_t* global_shape; /* NULL: the tensor is whole (no layout) */
  const int64_t* offsets;      /* ndim entries when global_shape is set */
  const char* global_name;     /* NULL or "": the tensor's own name */
} ckpt_tensor_layout;

/* The layout a tensor was saved with, as a restore reports it. */
typedef struct {
  int has_layout; /* 0: saved whole; every other field is zero */
  int ndim;
  int64_t global_shape[8];
  int64_t offsets[8];
  char global_name[160]; /* NUL-terminated; "": the tensor's own name */
} ckpt_saved_layout;

/* ckpt::ClientOptions, field by field. Call ckpt_options_init() first: it
 * sets every field to the C++ default, so fields added later keep theirs. */
typedef struct {
  const char* socket_path; /* NULL: $CKPT_SOCKET */
  const char* job;         /* NULL: $CKPT_JOB */
  int rank;                /* -1: $RANK (ckpt_resolve_rank) */
  int world_size;          /* -1: $WORLD_SIZE (ckpt_resolve_rank) */
  uint64_t slot_bytes;     /* 0: sized by the first save */
  int num_slots;           /* 0: 2 */
  int block_when_busy;     /* 0: return CKPT_RESOURCE_EXHAUSTED when busy */
  int copy_threads;        /* 0: one per CPU */
  double slot_headroom;    /* with slot_bytes 0: extra fraction, in [0, 16] */
  int64_t busy_timeout_ms; /* block_when_busy: longest wait; default 10 min */
} ckpt_options;

/* ckpt::SaveOptions, field by field. Call ckpt_save_options_init() first:
 * it sets every field to the C++ default, so fields added later keep
 * theirs. */
typedef struct {
  /* A save of a step below this rank's newest drops the newer steps; it is
   * refused (CKPT_FAILED_PRECONDITION naming them) unless this process
   * restored a step <= it first, or rewind is nonzero. */
  int rewind;
} ckpt_save_options;

typedef struct ckpt_client ckpt_client;
typedef struct ckpt_save_handle ckpt_save_handle;

/* What the last save of a client took (ckpt::SaveStats). */
typedef struct {
  double wait_slot_s; /* blocked waiting for a free slot */
  double copy_s;      /* copy + checksum */
  double rpc_s;       /* BeginSave + Commit */
  double total_s;
  uint64_t bytes;
} ckpt_save_stats;

/* What the last restore of a client read (ckpt::RestoreStats). */
typedef struct {
  uint64_t bytes;       /* bytes of the tensors asked for */
  uint64_t bytes_read;  /* saved bytes read (copied or hashed) for them */
  uint32_t saved_ranks; /* saved ranks' shards read from */
  int resharded;        /* 1: served by the restore into another layout */
} ckpt_restore_stats;

/* Bumped when a struct or signature of this header changes incompatibly;
 * a binding loading libckpt.so at run time checks it. */
#define CKPT_ABI_VERSION 1
int ckpt_abi_version(void);

/* Sets every field to its default (a NULL options is ignored). */
void ckpt_options_init(ckpt_options* options);
/* Sets every field to its default (a NULL options is ignored). */
void ckpt_save_options_init(ckpt_save_options* options);
/* The message of the calling thread's last failure ("" after a success). */
const char* ckpt_last_error(void);

/* The launcher rule every binding shares: *rank / *world_size of -1 come
 * from $RANK / $WORLD_SIZE; with neither given nor set (a process no
 * launcher started) the process is rank 0 of 1. *local_rank (NULL to skip)
 * gets $LOCAL_RANK, or -1 when unset. A non-integer, negative or
 * out-of-range value is CKPT_INVALID_ARGUMENT naming the variable, and
 * leaves the outputs unchanged. ckpt_connect applies the same rule. */
ckpt_status ckpt_resolve_rank(int* rank, int* world_size, int* local_rank);

/* options NULL: every default. */
ckpt_status ckpt_connect(const ckpt_options* options, ckpt_client** out);
/* Finishes every queued save, then frees the client (NULL is ignored). */
void ckpt_close(ckpt_client* client);

/* A save of the rank's newest step replaces it; a lower step is refused
 * unless this process restored a step <= it first (see ckpt_save_options;
 * ckpt_save is ckpt_save_ex with the defaults). */
ckpt_status ckpt_save(ckpt_client* client, int64_t step,
                      const ckpt_tensor* tensors, size_t count);
/* options NULL: every default. */
ckpt_status ckpt_save_ex(ckpt_client* client, int64_t step,
                         const ckpt_tensor* tensors, size_t count,
                         const ckpt_save_options* options);
/* The tensors must stay unmodified until ckpt_wait_copied() returns. */
ckpt_status ckpt_save_async(ckpt_client* client, int64_t step,
                            const ckpt_tensor* tensors, size_t count,
                            ckpt_save_handle** out);
ckpt_status ckpt_save_async_ex(ckpt_client* client, int64_t step,
                               const ckpt_tensor* tensors, size_t count,
                               const ckpt_save_options* options,
                               ckpt_save_handle** out);
/* ckpt_save_ex / ckpt_save_async_ex with layouts[i] placing tensors[i] in
 * its global tensor (layouts NULL, or an entry whose global_shape is NULL:
 * whole tensors). The daemon refuses a layout that does not fit the shape
 * (CKPT_INVALID_ARGUMENT naming the field) and nothing is saved. */
ckpt_status ckpt_save_layout(ckpt_client* client, int64_t step,
                             const ckpt_tensor* tensors,
                             const ckpt_tensor_layout* layouts, size_t count,
                             const ckpt_save_options* options);
ckpt_status ckpt_save_async_layout(ckpt_client* client, int64_t step,
                                   const ckpt_tensor* tensors,
                                   const ckpt_tensor_layout* layouts,
                                   size_t count,
                                   const ckpt_save_options* options,
                                   ckpt_save_handle** out);
ckpt_status ckpt_wait_copied(ckpt_save_handle* handle);
/* Waits for the save to finish and frees the handle. */
ckpt_status ckpt_wait(ckpt_save_handle* handle);

/* *step = -1 and CKPT_NOT_FOUND when the job has no checkpoint. */
ckpt_status ckpt_latest_step(ckpt_client* client, int64_t* step);
ckpt_status ckpt_restore(ckpt_client* client, int64_t step,
                         const ckpt_tensor* tensors, size_t count);
/* ckpt_restore; layouts (may be NULL) as in ckpt_save_layout: the place
 * of each tensor in its global tensor, which the saved pieces fill when
 * this rank saved it elsewhere (doc/resharding.md; a region no saved
 * piece holds is CKPT_FAILED_PRECONDITION naming it). saved (may be NULL,
 * else count entries): after a success, the layout each tensor was saved
 * with, or the place it was filled at. */
ckpt_status ckpt_restore_layout(ckpt_client* client, int64_t step,
                                const ckpt_tensor* tensors,
                                const ckpt_tensor_layout* layouts, size_t count,
                                ckpt_saved_layout* saved);
/* Restores the newest step whose copies verify and sets *step to it (-1 on
 * failure). A copy failing verification is reported and the next copy, then
 * the previous good step, is tried in this one call; the tensors end holding
 * exactly one step's bytes. CKPT_NOT_FOUND when the job has no checkpoint;
 * CKPT_DATA_LOSS naming every step tried when none verifies. */
ckpt_status ckpt_restore_latest(ckpt_client* client, const ckpt_tensor* tensors,
                                size_t count, int64_t* step);
ckpt_status ckpt_wait_durable(ckpt_client* client, int64_t step,
                              int64_t timeout_ms);
/* Progress beacon (ckpt::Client::Progress): call once per training step.
 * A store into shared memory, no system call. compute_s: this rank's own
 * compute seconds of the step; negative: not reported. */
ckpt_status ckpt_progress(ckpt_client* client, int64_t step, double compute_s);
/* The next `seconds` may show no progress (ckpt::Client::ExpectPause);
 * reason may be NULL. */
ckpt_status ckpt_expect_pause(ckpt_client* client, double seconds,
                              const char* reason);
/* The stats of the client's last finished save (all zero before one). */
ckpt_status ckpt_last_save_stats(ckpt_client* client, ckpt_save_stats* out);
/* The stats of the client's last finished restore (all zero before one). */
ckpt_status ckpt_last_restore_stats(ckpt_client* client,
                                    ckpt_restore_stats* out);

/* In-process restart under ckptrun (ckpt::RestartPlan): the assignment of
 * a generation for this process. */
typedef struct {
  uint64_t generation;
  uint32_t rank;
  uint32_t world_size;
  uint32_t local_rank;
  uint32_t local_world_size;
  char master_addr[256]; /* NUL-terminated */
  uint32_t master_port;
  int has_restore_step; /* 0: a fresh start, restore_step unset */
  int64_t restore_step;
} ckpt_plan;

/* Tells ckptrun this process restarts in place (ckpt::EnableRestart).
 * CKPT_FAILED_PRECONDITION when $CKPT_RESTART_DIR is unset. */
ckpt_status ckpt_restart_enable(void);
/* Never blocks (ckpt::PollRestart): *fresh = 1 and *out filled when the
 * newest plan's generation is greater than `after`, else *fresh = 0 and
 * *out unchanged. A malformed plan is CKPT_INVALID_ARGUMENT naming the
 * key. */
ckpt_status ckpt_restart_poll(uint64_t after, ckpt_plan* out, int* fresh);
/* This process left its old generation and takes plan `generation`. */
ckpt_status ckpt_restart_joined(uint64_t generation);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CKPT_H_ */
