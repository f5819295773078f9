/* tdev.h - device helpers shared by the tests that drive a backend (sim or cuda) directly: buffers, streams and
 * events that must exist (the test fails otherwise), copies that wait for their stream, and launches of the
 * fill and add kernels built by hand. Fill is a test-only write: no op launches it. Include after <cmocka.h>. */
#ifndef PPN_TDEV_H
#define PPN_TDEV_H

#include <stdint.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"

/* n bytes on device dev; never 0. */
ppn_dptr tu_dalloc(ppn_gpu *g, int dev, size_t n);
/* A stream on device dev (checked to report that device). */
ppn_gstream *tu_stream(ppn_gpu *g, int dev);
/* An event on device dev, timing or not. */
ppn_gevent *tu_event(ppn_gpu *g, int dev, int timing);
/* n bytes host -> device and device -> host on s, each waiting for s. */
void tu_upload(ppn_gpu *g, ppn_gstream *s, ppn_dptr d, const void *h, size_t n);
void tu_download(ppn_gpu *g, ppn_gstream *s, void *h, ppn_dptr d, size_t n);

/* A launch of PPN_K_FILL writing n u32 words of value at out, declaring that write (for the sim checker); p
 * holds the params and must live until the launch is enqueued. Elementwise geometry: 256 threads a block. */
ppn_launch tu_launch_fill(ppn_kp_fill *p, ppn_dptr out, uint32_t value, int n);
/* A launch of PPN_K_ADD, out[i] = a[i] + b[i] over n floats, declaring its reads of a and b and its write. */
ppn_launch tu_launch_add(ppn_kp_add *p, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n);
/* Those launches enqueued on s; each returns the backend's status. */
ppn_status tu_fill(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, uint32_t value, int n);
ppn_status tu_add(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n);

#endif
