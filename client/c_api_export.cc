// The one source of libckpt.so (CMake needs one): the C API itself comes
// from ckpt_client, linked whole (client/CMakeLists.txt), and libckpt.map
// exports its ckpt_* symbols only. Including the header here keeps this
// translation unit compiled against the contract it exports.
#include "ckpt/ckpt.h"
