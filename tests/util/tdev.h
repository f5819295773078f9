/* tdev.h - device helpers shared by the tests that drive a backend (sim or cuda) directly: the fill kernel, a
 * test-only write that no op launches. */
#ifndef PPN_TDEV_H
#define PPN_TDEV_H

#include <stdint.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"

/* A launch of PPN_K_FILL writing n u32 words of value at out, declaring that write (for the sim checker); p
 * holds the params and must live until the launch is enqueued. Elementwise geometry: 256 threads a block. */
ppn_launch tu_launch_fill(ppn_kp_fill *p, ppn_dptr out, uint32_t value, int n);
/* Enqueue that launch on s; returns the backend's status. */
ppn_status tu_fill(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, uint32_t value, int n);

#endif
