#define CKPT_ISA_NS sse2
#include "util/checksum_impl.inc"
