/* topo.c - hwloc placement of devices and issue threads (see topo.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hwloc.h>
#include "sched/topo.h"
#include "core/base/err.h"

struct ppn_topo {
    hwloc_topology_t h;
};

ppn_status ppn_topo_load(ppn_topo **out, int io)
{
    *out = NULL;
    ppn_topo *t = calloc(1, sizeof *t);
    if (!t) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    if (hwloc_topology_init(&t->h) != 0) {
        free(t);
        return ppn_err(PPN_EIO, "topo: hwloc_topology_init failed: %s", strerror(errno));
    }
    hwloc_topology_set_io_types_filter(t->h, io ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
    if (hwloc_topology_load(t->h) != 0) {
        int e = errno;
        hwloc_topology_destroy(t->h);
        free(t);
        return ppn_err(PPN_EIO, "topo: hwloc_topology_load failed: %s", strerror(e));
    }
    *out = t;
    return PPN_OK;
}

void ppn_topo_destroy(ppn_topo *t)
{
    if (!t) return;
    hwloc_topology_destroy(t->h);
    free(t);
}

int ppn_topo_n_cores(const ppn_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_CORE);
    return n > 0 ? n : hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_PU);
}

int ppn_topo_n_numa(const ppn_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_NUMANODE);
    return n > 0 ? n : 1;
}

/* The cpuset local to a device: its PCI ancestor's for a located cuda device, a NUMA node's for sim. */
static hwloc_const_cpuset_t device_cpuset(ppn_topo *t, ppn_gpu *g, int dev, int *numa, int *located)
{
    ppn_device_info info;
    *located = 0;
    *numa = -1;
    if (g->ops->device_info(g, dev, &info) != PPN_OK) return NULL;
    if (!info.sim && info.pci_bus_id[0]) {
        unsigned dom, bus, d, fn;
        if (sscanf(info.pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &d, &fn) == 4) {
            hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->h, dom, bus, d, fn);
            hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(t->h, pci) : NULL;
            if (anc && anc->cpuset) {
                *located = 1;
                hwloc_obj_t node = hwloc_get_next_obj_covering_cpuset_by_type(t->h, anc->cpuset,
                                                                             HWLOC_OBJ_NUMANODE, NULL);
                *numa = node ? (int)node->logical_index : 0;
                return anc->cpuset;
            }
        }
    }
    int nn = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_NUMANODE);
    if (nn > 0) {
        hwloc_obj_t node = hwloc_get_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, (unsigned)(dev % nn));
        *numa = (int)node->logical_index;
        if (node->cpuset && !hwloc_bitmap_iszero(node->cpuset)) return node->cpuset;
    }
    return hwloc_topology_get_topology_cpuset(t->h);
}

ppn_status ppn_topo_place_device(ppn_topo *t, ppn_gpu *g, int dev, ppn_dev_place *out)
{
    memset(out, 0, sizeof *out);
    if (dev < 0 || dev >= g->ops->device_count(g))
        return ppn_err(PPN_EINVAL, "topo: device %d does not exist", dev);
    hwloc_const_cpuset_t cs = device_cpuset(t, g, dev, &out->numa_node, &out->located);
    if (!cs) return ppn_err_ctx(PPN_EDRIVER, "topo: device %d info", dev);
    hwloc_bitmap_list_snprintf(out->cpuset, sizeof out->cpuset, cs);
    out->n_pus = hwloc_bitmap_weight(cs);
    return PPN_OK;
}

/* The n-th core (first PU) inside cs not yet in used; -1 if none free. */
static int free_core_in(ppn_topo *t, hwloc_const_cpuset_t cs, hwloc_bitmap_t used)
{
    hwloc_obj_type_t type = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    for (hwloc_obj_t c = NULL; (c = hwloc_get_next_obj_inside_cpuset_by_type(t->h, cs, type, c));) {
        int pu = hwloc_bitmap_first(c->cpuset);
        if (pu >= 0 && !hwloc_bitmap_isset(used, (unsigned)pu)) return pu;
    }
    return -1;
}

ppn_status ppn_topo_pick_cores(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out,
                               int *shared)
{
    *shared = 0;
    hwloc_bitmap_t used = hwloc_bitmap_alloc();
    if (!used) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(t->h);
    for (int s = 0; s < n_stages; s++) {
        int numa, located;
        hwloc_const_cpuset_t cs = device_cpuset(t, g, stage_dev[s], &numa, &located);
        if (!cs) {
            hwloc_bitmap_free(used);
            return ppn_err(PPN_EINVAL, "topo: stage %d: device %d does not exist", s, stage_dev[s]);
        }
        int pu = free_core_in(t, cs, used);
        if (pu < 0) pu = free_core_in(t, all, used); /* far but distinct beats near but shared */
        if (pu < 0) { /* fewer cores than stages: share, round robin over the machine's cores */
            *shared = 1;
            hwloc_obj_type_t type =
                hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
            hwloc_obj_t c = hwloc_get_obj_by_type(t->h, type, (unsigned)(s % ppn_topo_n_cores(t)));
            pu = c ? hwloc_bitmap_first(c->cpuset) : 0;
        }
        hwloc_bitmap_set(used, (unsigned)pu);
        pu_out[s] = pu;
    }
    hwloc_bitmap_free(used);
    return PPN_OK;
}

/* The first PU of allowed outside cs and not in used; -1 if none. */
static int first_pu_outside(hwloc_const_bitmap_t allowed, hwloc_const_cpuset_t cs, hwloc_const_bitmap_t used)
{
    for (int pu = hwloc_bitmap_first(allowed); pu >= 0; pu = hwloc_bitmap_next(allowed, pu))
        if (!hwloc_bitmap_isset(cs, (unsigned)pu) && !hwloc_bitmap_isset(used, (unsigned)pu)) return pu;
    return -1;
}

ppn_status ppn_topo_pick_far(ppn_topo *t, ppn_gpu *g, const int *stage_dev, int n_stages, int *pu_out)
{
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc(), used = hwloc_bitmap_alloc();
    ppn_status st = PPN_OK;
    if (!allowed || !used) st = ppn_err(PPN_ENOMEM, "topo: host out of memory");
    else if (hwloc_get_cpubind(t->h, allowed, HWLOC_CPUBIND_THREAD) != 0)
        st = ppn_err(PPN_EINVAL, "PPN_PIN=far: reading this thread's CPU binding failed (errno %d)", errno);
    for (int s = 0; s < n_stages && st == PPN_OK; s++) {
        int numa, located;
        hwloc_const_cpuset_t cs = device_cpuset(t, g, stage_dev[s], &numa, &located);
        if (!cs) {
            st = ppn_err(PPN_EINVAL, "topo: stage %d: device %d does not exist", s, stage_dev[s]);
            break;
        }
        int pu = first_pu_outside(allowed, cs, used);
        if (pu >= 0) pu_out[s] = pu;
        hwloc_bitmap_set(used, (unsigned)pu_out[s]);
    }
    hwloc_bitmap_free(allowed);
    hwloc_bitmap_free(used);
    return st;
}

ppn_status ppn_topo_bind_self(ppn_topo *t, int pu)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    if (pu < 0) hwloc_bitmap_copy(set, hwloc_topology_get_topology_cpuset(t->h));
    else hwloc_bitmap_only(set, (unsigned)pu);
    int rc = hwloc_set_cpubind(t->h, set, HWLOC_CPUBIND_THREAD);
    int e = errno;
    hwloc_bitmap_free(set);
    if (rc != 0) return ppn_err(PPN_EINVAL, "topo: cannot pin thread to PU %d: %s", pu, strerror(e));
    return PPN_OK;
}
