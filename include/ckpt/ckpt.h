/* libckpt C API: mirrors ckpt/client.h for bindings from other languages.
 *
 * Every function returns a ckpt_status code (0 = OK, otherwise an
 * absl::StatusCode value); the message of the last failure on the calling
 * thread is available from ckpt_last_error(). A ckpt_client may be used from
 * several threads; a ckpt_save_handle from one.
 */
#ifndef CKPT_CKPT_H_
#define CKPT_CKPT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int ckpt_status;
enum {
  CKPT_OK = 0,
  CKPT_INVALID_ARGUMENT = 3,
  CKPT_NOT_FOUND = 5,
  CKPT_PERMISSION_DENIED = 7,
  CKPT_RESOURCE_EXHAUSTED = 8,
  CKPT_FAILED_PRECONDITION = 9,
  CKPT_INTERNAL = 13,
  CKPT_UNAVAILABLE = 14,
  CKPT_DATA_LOSS = 15,
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

typedef struct {
  const char* socket_path; /* NULL: $CKPT_SOCKET */
  const char* job;         /* NULL: $CKPT_JOB */
  int rank;                /* -1: $RANK */
  int world_size;          /* -1: $WORLD_SIZE */
  uint64_t slot_bytes;     /* 0: sized by the first save */
  int num_slots;           /* 0: 2 */
  int block_when_busy;     /* 0: return CKPT_RESOURCE_EXHAUSTED when busy */
  int copy_threads;        /* 0: one per CPU */
} ckpt_options;

typedef struct ckpt_client ckpt_client;
typedef struct ckpt_save_handle ckpt_save_handle;

void ckpt_options_init(ckpt_options* options);
const char* ckpt_last_error(void);

ckpt_status ckpt_connect(const ckpt_options* options, ckpt_client** out);
void ckpt_close(ckpt_client* client);

ckpt_status ckpt_save(ckpt_client* client, int64_t step,
                      const ckpt_tensor* tensors, size_t count);
/* The tensors must stay unmodified until ckpt_wait_copied() returns. */
ckpt_status ckpt_save_async(ckpt_client* client, int64_t step,
                            const ckpt_tensor* tensors, size_t count,
                            ckpt_save_handle** out);
ckpt_status ckpt_wait_copied(ckpt_save_handle* handle);
/* Waits for the save to finish and frees the handle. */
ckpt_status ckpt_wait(ckpt_save_handle* handle);

/* *step = -1 and CKPT_NOT_FOUND when the job has no checkpoint. */
ckpt_status ckpt_latest_step(ckpt_client* client, int64_t* step);
ckpt_status ckpt_restore(ckpt_client* client, int64_t step,
                         const ckpt_tensor* tensors, size_t count);
ckpt_status ckpt_wait_durable(ckpt_client* client, int64_t step,
                              int64_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CKPT_H_ */
