/* A trainer's smallest C use of the installed libckpt, built outside the
 * tree with `pkg-config --cflags --libs ckpt` (packaging/tests/).
 * No argument: prints the library's ABI version (no daemon needed).
 * SOCKET JOB: saves step 1 of 1024 floats to the ckptd at SOCKET, waits
 * until it is durable, restores it into a zeroed buffer and compares the
 * bytes. Exit 0 when all of it worked. */
#include <ckpt/ckpt.h>
#include <stdio.h>
#include <string.h>

static int fail(const char* what, ckpt_status s) {
  fprintf(stderr, "consumer_c: %s: status %d: %s\n", what, s,
          ckpt_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (ckpt_abi_version() != CKPT_ABI_VERSION) return fail("abi", -1);
  if (argc < 3) {
    printf("consumer_c: libckpt ABI %d\n", ckpt_abi_version());
    return 0;
  }
  ckpt_options options;
  ckpt_options_init(&options);
  options.socket_path = argv[1];
  options.job = argv[2];
  options.rank = 0;
  options.world_size = 1;
  ckpt_client* client = NULL;
  ckpt_status s = ckpt_connect(&options, &client);
  if (s != CKPT_OK) return fail("connect", s);
  static float saved[1024], restored[1024];
  for (int i = 0; i < 1024; ++i) saved[i] = (float)i * 0.5f - 7.0f;
  int64_t shape[1] = {1024};
  ckpt_tensor t = {"w", CKPT_FLOAT32, 1, shape, saved, -1};
  if ((s = ckpt_save(client, 1, &t, 1)) != CKPT_OK) return fail("save", s);
  if ((s = ckpt_wait_durable(client, 1, 60000)) != CKPT_OK)
    return fail("wait_durable", s);
  t.data = restored;
  if ((s = ckpt_restore(client, 1, &t, 1)) != CKPT_OK)
    return fail("restore", s);
  ckpt_close(client);
  if (memcmp(saved, restored, sizeof(saved)) != 0)
    return fail("bytes differ", -1);
  printf("consumer_c: step 1 saved and restored bit-exact\n");
  return 0;
}
