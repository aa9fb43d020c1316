/* Compiled by build.rs as C11 and as C++11 at every build: the
 * static_asserts of cpnet/cmd.h (every size and offset) run on the host
 * compiler, whatever NVRTC version is present. */
#include "cpnet/cmd.h"
int cpnet_layout_checked(void) { return CPNET_SLOT_BYTES; }
