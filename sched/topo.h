/* topo.h - hwloc topology: where each device sits (its package, local cpuset and NUMA node), which core each
 * stage's issue thread is pinned to, and where memory is bound and where the OS says it lies.
 *
 * Devices are located from their PCI bus id (cuda: read through our driver table, never through hwloc/cuda.h,
 * which would link libcuda; sim: the ids gpu_sim.c gives its devices) with hwloc_get_pcidev_by_busid +
 * hwloc_get_non_io_ancestor_obj, on a topology loaded with the important I/O objects kept. A device the
 * topology does not hold (no PCI id, or no such PCI device) is placed on the whole machine (every NUMA node);
 * where the machine has more than one node that is said once per device in a one-line notice on stderr.
 *
 * PPN_TOPO_XML=file: the topology is read from an hwloc XML file instead of being discovered, and is taken as
 * this machine's: binding calls reach the OS with the file's OS indexes (tests describe machines of 2 and 4
 * packages, sim devices on different nodes, and pin for real on whatever of it this machine has).
 *
 * Nodes and packages in this interface are hwloc logical indexes; PUs are OS indexes. Node -1: none (all).
 * Threading: a ppn_topo is read-only after load (but for the notice mask, atomic); every call is thread-safe.
 */
#ifndef PPN_TOPO_H
#define PPN_TOPO_H

#include <sys/types.h>
#include "core/device/gpu.h"

typedef struct ppn_topo ppn_topo;

typedef struct ppn_dev_place {
    int numa_node;        /* logical index of the device's local NUMA node; -1: not located (all nodes) */
    int package;          /* logical index of its package; -1 if unknown */
    int located;          /* 1: found from the device's PCI id; 0: whole machine */
    int n_pus;            /* PUs in the local cpuset */
    char pci[32];         /* the device's PCI bus id ("" when it has none) */
    char cpuset[256];     /* hwloc list syntax, e.g. "0-15" */
} ppn_dev_place;

/* io = 1 keeps PCI objects (needed to locate real GPUs; the sim backend passes 0, which also avoids hwloc's
 * PCI discovery; with PPN_TOPO_XML they are always kept: the file is where sim devices have a place).
 * Returns PPN_OK, PPN_EINVAL (PPN_TOPO_XML names a file hwloc cannot read: message has the path), PPN_EIO. */
ppn_status ppn_topo_load(ppn_topo **out, int io);
void ppn_topo_destroy(ppn_topo *t);
int ppn_topo_n_cores(const ppn_topo *t);
int ppn_topo_n_numa(const ppn_topo *t);
int ppn_topo_n_packages(const ppn_topo *t);
/* "this machine" or "PPN_TOPO_XML=<file>", for reports. */
const char *ppn_topo_source(const ppn_topo *t);

/* Where device dev of backend g sits. Returns PPN_OK, PPN_EINVAL (no such device), PPN_EDRIVER. */
ppn_status ppn_topo_place_device(ppn_topo *t, ppn_gpu *g, int dev, ppn_dev_place *out);

/* Pick one core (an OS index of the core's first PU) per stage, near each stage's device, distinct while
 * there are enough cores; *shared is set to 1 when stages had to share cores. Returns PPN_OK or PPN_EINVAL. */
ppn_status ppn_topo_pick_cores(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out,
                               int *shared);

/* PPN_PIN=far (a measurement arm): move each stage's pick (pu_out, from ppn_topo_pick_cores) far from its device.
 * A located device on a machine of several packages: a free core of the next package after the device's (the
 * other socket of a 2-socket machine); otherwise the first PU of the calling thread's binding outside the
 * device's cpuset and not taken by an earlier stage. A stage keeps its near pick where there is neither.
 * Returns PPN_OK, PPN_EINVAL, PPN_ENOMEM. */
ppn_status ppn_topo_pick_far(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out);

/* The NUMA node holding PU pu (OS index); -1 when pu < 0 or no single node holds it. */
int ppn_topo_pu_node(ppn_topo *t, int pu);

/* Pin the calling thread to PU pu (< 0: the whole machine) and bind its memory to node (< 0: the default
 * policy). Returns PPN_OK, PPN_EINVAL (the CPU binding failed), PPN_EIO (the CPU binding held, the memory
 * binding failed: e.g. a node of PPN_TOPO_XML this machine lacks, and the thread's memory is back on the default
 * policy, not left on an earlier node); the message says which. */
ppn_status ppn_topo_bind_self(ppn_topo *t, int pu, int node);

/* The calling thread's memory binding as the OS says (hwloc_get_membind: get_mempolicy): *node = the node's
 * logical index when bound to exactly one node, else -1 (the default policy, several nodes, or a node the topology
 * does not know). Returns PPN_OK or PPN_EIO. */
ppn_status ppn_topo_self_mem_node(ppn_topo *t, int *node);

/* Bind [p, p + n) (page aligned) to node (HWLOC_MEMBIND_BIND, strict: MPOL_BIND): pages are taken there when
 * first touched.
 * Returns PPN_OK, PPN_EINVAL (no such node), PPN_EIO (the kernel refused: message has errno). */
ppn_status ppn_topo_bind_area(ppn_topo *t, void *p, size_t n, int node);

/* Interleave [p, p + n) over every NUMA node (HWLOC_MEMBIND_INTERLEAVE). Returns PPN_OK or PPN_EIO. */
ppn_status ppn_topo_interleave_area(ppn_topo *t, void *p, size_t n);

/* Where the resident pages of [p, p + n) lie, as the OS says (hwloc_get_area_memlocation: move_pages).
 * *node = the node's logical index when every resident page is on one node; -1 none resident; -2 several
 * nodes; -3 a node the topology does not know (list: hwloc list syntax of the OS node indexes, may be NULL).
 * Returns PPN_OK or PPN_EIO (the kernel refused the query: message has errno). */
ppn_status ppn_topo_area_node(ppn_topo *t, const void *p, size_t n, int *node, char *list, size_t cap);

/* The PUs thread tid is bound to, read back from the OS, in hwloc list syntax. Returns PPN_OK or PPN_EIO. */
ppn_status ppn_topo_thread_cpus(ppn_topo *t, pid_t tid, char *buf, size_t cap);

#endif
