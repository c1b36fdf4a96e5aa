// Links ckpt_client and nothing else: tests/doc_snippets_test.py links the
// documentation's C++ blocks with this program's link line, so they link
// what a trainer's target that links ckpt_client links.
#include "ckpt/client.h"

int main() {
  ckpt::ClientOptions options;
  return options.num_slots == 2 ? 0 : 1;
}
