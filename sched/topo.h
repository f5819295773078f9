/* topo.h - hwloc topology: where each device sits (local cpuset, NUMA node) and which core each stage's
 * issue thread is pinned to.
 *
 * cuda devices are located from their PCI bus id (read through our driver table, never through hwloc/cuda.h,
 * which would link libcuda): hwloc_get_pcidev_by_busid + hwloc_get_non_io_ancestor_obj on a topology loaded
 * with important I/O objects kept. sim devices are spread over the machine's NUMA nodes (dev % nodes).
 * Threading: a ppn_topo is read-only after load; bind_thread may be called from any thread.
 */
#ifndef PPN_TOPO_H
#define PPN_TOPO_H

#include "core/device/gpu.h"

typedef struct ppn_topo ppn_topo;

typedef struct ppn_dev_place {
    int numa_node;        /* logical index of the NUMA node, -1 if unknown */
    int located;          /* 1: found from the device's PCI id; 0: sim or not found (whole machine) */
    int n_pus;            /* PUs in the local cpuset */
    char cpuset[256];     /* hwloc list syntax, e.g. "0-15" */
} ppn_dev_place;

/* io = 1 keeps PCI objects (needed to locate real GPUs; the sim backend passes 0, which also avoids loading
 * hwloc's PCI plugin). Returns PPN_OK or PPN_EIO (hwloc could not load the topology; message has errno). */
ppn_status ppn_topo_load(ppn_topo **out, int io);
void ppn_topo_destroy(ppn_topo *t);
int ppn_topo_n_cores(const ppn_topo *t);
int ppn_topo_n_numa(const ppn_topo *t);

/* Where device dev of backend g sits. Returns PPN_OK, PPN_EINVAL (no such device), PPN_EDRIVER. */
ppn_status ppn_topo_place_device(ppn_topo *t, ppn_gpu *g, int dev, ppn_dev_place *out);

/* Pick one core (an OS index of the core's first PU) per stage, near each stage's device, distinct while
 * there are enough cores; *shared is set to 1 when stages had to share cores. Returns PPN_OK or PPN_EINVAL. */
ppn_status ppn_topo_pick_cores(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out,
                               int *shared);

/* PPN_PIN=far (a measurement arm): move each stage's pick (pu_out, from ppn_topo_pick_cores) to the first PU of
 * the calling thread's binding outside its device's cpuset and not taken by an earlier stage; a stage keeps
 * its near pick where there is none (one NUMA node). Returns PPN_OK, PPN_EINVAL, PPN_ENOMEM. */
ppn_status ppn_topo_pick_far(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out);

/* Pin the calling thread to PU os_index; pu < 0 unpins it (the whole machine's cpuset).
 * Returns PPN_OK or PPN_EINVAL. */
ppn_status ppn_topo_bind_self(ppn_topo *t, int pu);

#endif
