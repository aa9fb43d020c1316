/* nvshmemx.h -- NVSHMEM's extension names (nvshmemx_*) on cpnet: they are
 * all in nvshmem.h, which this includes. */
#ifndef CPNET_NVSHMEMX_H
#define CPNET_NVSHMEMX_H
#include <nvshmem.h>
#endif
