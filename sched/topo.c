/* topo.c - hwloc placement of devices, issue threads and memory (see topo.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hwloc.h>
#include "sched/topo.h"
#include "core/base/env.h"
#include "core/base/err.h"

struct ppn_topo {
    hwloc_topology_t h;
    char source[300];              /* for reports: "this machine" or "PPN_TOPO_XML=<file>" */
    _Atomic uint64_t noticed;      /* devices 0..63 already named in the not-located notice */
};

/* PPN_TOPO_XML: read the file, keep its I/O objects, and take it as this machine (bindings reach the OS). */
static ppn_status topo_source(ppn_topo *t, int *io)
{
    const char *xml;
    PPN_CHECK(ppn_env_str("PPN_TOPO_XML", &xml));
    if (!xml) {
        snprintf(t->source, sizeof t->source, "this machine");
        return PPN_OK;
    }
    snprintf(t->source, sizeof t->source, "PPN_TOPO_XML=%s", xml);
    if (hwloc_topology_set_xml(t->h, xml) != 0)
        return ppn_err(PPN_EINVAL, "PPN_TOPO_XML='%s': hwloc cannot read it as a topology: %s", xml, strerror(errno));
    hwloc_topology_set_flags(t->h, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM);
    *io = 1;
    return PPN_OK;
}

ppn_status ppn_topo_load(ppn_topo **out, int io)
{
    *out = NULL;
    ppn_topo *t = calloc(1, sizeof *t);
    if (!t) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    if (hwloc_topology_init(&t->h) != 0) {
        free(t);
        return ppn_err(PPN_EIO, "topo: hwloc_topology_init failed: %s", strerror(errno));
    }
    ppn_status st = topo_source(t, &io);
    if (st == PPN_OK) {
        hwloc_topology_set_io_types_filter(t->h, io ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
        if (hwloc_topology_load(t->h) != 0)
            st = ppn_err(PPN_EIO, "topo: hwloc_topology_load (%s) failed: %s", t->source, strerror(errno));
    }
    if (st != PPN_OK) {
        hwloc_topology_destroy(t->h);
        free(t);
        return st;
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

int ppn_topo_n_packages(const ppn_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_PACKAGE);
    return n > 0 ? n : 1;
}

const char *ppn_topo_source(const ppn_topo *t) { return t->source; }

/* The object of type covering cs wholly (the smallest one), or NULL. */
static hwloc_obj_t covering(ppn_topo *t, hwloc_const_cpuset_t cs, hwloc_obj_type_t type)
{
    hwloc_obj_t o = hwloc_get_obj_covering_cpuset(t->h, cs);
    while (o && o->type != type) o = o->parent;
    return o;
}

/* The local NUMA node of a non-I/O object: the node whose cpuset holds the object's (a package or a group with
 * one node), else -1 (the object spans several nodes). */
static int local_node(ppn_topo *t, hwloc_obj_t o)
{
    int found = -1;
    for (hwloc_obj_t n = NULL; (n = hwloc_get_next_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, n));)
        if (hwloc_bitmap_isincluded(o->cpuset, n->cpuset)) found = (int)n->logical_index;
    if (found < 0 && o->nodeset && hwloc_bitmap_weight(o->nodeset) == 1) {
        hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(t->h, (unsigned)hwloc_bitmap_first(o->nodeset));
        if (n) found = (int)n->logical_index;
    }
    return found;
}

/* Say once per device (and only where there is a choice of node) that it has no place in the topology. */
static void notice_not_located(ppn_topo *t, int dev, const char *pci)
{
    if (ppn_topo_n_numa(t) < 2 || dev < 0 || dev > 63) return;
    uint64_t bit = 1ull << dev;
    if (atomic_fetch_or(&t->noticed, bit) & bit) return;
    fprintf(stderr, "ppn: notice: device %d (%s%s) has no locality in the topology (%s): its issue thread and "
            "host memory may use any of the %d NUMA nodes\n", dev, pci[0] ? "pci " : "no PCI id", pci, t->source,
            ppn_topo_n_numa(t));
}

/* Where device dev sits: its PCI device's first non-I/O ancestor, else the whole machine. */
static ppn_status locate(ppn_topo *t, ppn_gpu *g, int dev, hwloc_const_cpuset_t *cs, ppn_dev_place *pl)
{
    ppn_device_info info;
    memset(pl, 0, sizeof *pl);
    pl->numa_node = pl->package = -1;
    if (dev < 0 || dev >= g->ops->device_count(g)) return ppn_err(PPN_EINVAL, "topo: device %d does not exist", dev);
    PPN_CHECK(g->ops->device_info(g, dev, &info));
    snprintf(pl->pci, sizeof pl->pci, "%s", info.pci_bus_id);
    unsigned dom, bus, d, fn;
    hwloc_obj_t anc = NULL;
    if (info.pci_bus_id[0] && sscanf(info.pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &d, &fn) == 4) {
        hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->h, dom, bus, d, fn);
        anc = pci ? hwloc_get_non_io_ancestor_obj(t->h, pci) : NULL;
    }
    if (anc && anc->cpuset && !hwloc_bitmap_iszero(anc->cpuset)) {
        hwloc_obj_t pkg = covering(t, anc->cpuset, HWLOC_OBJ_PACKAGE);
        pl->located = 1;
        pl->numa_node = local_node(t, anc);
        pl->package = pkg ? (int)pkg->logical_index : -1;
        *cs = anc->cpuset;
    } else {
        notice_not_located(t, dev, info.pci_bus_id);
        *cs = hwloc_topology_get_topology_cpuset(t->h);
        if (ppn_topo_n_numa(t) == 1 && hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_NUMANODE) == 1) pl->numa_node = 0;
    }
    hwloc_bitmap_list_snprintf(pl->cpuset, sizeof pl->cpuset, *cs);
    pl->n_pus = hwloc_bitmap_weight(*cs);
    return PPN_OK;
}

ppn_status ppn_topo_place_device(ppn_topo *t, ppn_gpu *g, int dev, ppn_dev_place *out)
{
    hwloc_const_cpuset_t cs;
    return locate(t, g, dev, &cs, out);
}

static hwloc_obj_type_t core_type(ppn_topo *t)
{
    return hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

/* The first PU of the first core inside cs whose PU is not in used; -1 if none free. */
static int free_core_in(ppn_topo *t, hwloc_const_cpuset_t cs, hwloc_bitmap_t used)
{
    for (hwloc_obj_t c = NULL; (c = hwloc_get_next_obj_inside_cpuset_by_type(t->h, cs, core_type(t), c));) {
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
        hwloc_const_cpuset_t cs;
        ppn_dev_place pl;
        ppn_status st = locate(t, g, stage_dev[s], &cs, &pl);
        if (st != PPN_OK) {
            hwloc_bitmap_free(used);
            return ppn_err_ctx(st, "topo: stage %d", s);
        }
        int pu = free_core_in(t, cs, used);
        if (pu < 0) pu = free_core_in(t, all, used); /* far but distinct beats near but shared */
        if (pu < 0) { /* fewer cores than stages: share, round robin over the machine's cores */
            *shared = 1;
            hwloc_obj_t c = hwloc_get_obj_by_type(t->h, core_type(t), (unsigned)(s % ppn_topo_n_cores(t)));
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

/* Far from a located device on a machine of several packages: a free core of the next package. */
static int far_package_pu(ppn_topo *t, const ppn_dev_place *pl, hwloc_const_bitmap_t used)
{
    int np = hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_PACKAGE);
    if (!pl->located || pl->package < 0 || np < 2) return -1;
    for (int k = 1; k < np; k++) {
        hwloc_obj_t pkg = hwloc_get_obj_by_type(t->h, HWLOC_OBJ_PACKAGE, (unsigned)((pl->package + k) % np));
        int pu = pkg ? free_core_in(t, pkg->cpuset, (hwloc_bitmap_t)used) : -1;
        if (pu >= 0) return pu;
    }
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
        hwloc_const_cpuset_t cs;
        ppn_dev_place pl;
        if ((st = locate(t, g, stage_dev[s], &cs, &pl)) != PPN_OK) break;
        int pu = far_package_pu(t, &pl, used);
        if (pu < 0) pu = first_pu_outside(allowed, cs, used);
        if (pu >= 0) pu_out[s] = pu;
        hwloc_bitmap_set(used, (unsigned)pu_out[s]);
    }
    hwloc_bitmap_free(allowed);
    hwloc_bitmap_free(used);
    return st;
}

int ppn_topo_pu_node(ppn_topo *t, int pu)
{
    if (pu < 0) return -1;
    hwloc_obj_t o = hwloc_get_pu_obj_by_os_index(t->h, (unsigned)pu);
    return o ? local_node(t, o) : -1;
}

static hwloc_obj_t node_obj(ppn_topo *t, int node)
{
    return node < 0 ? NULL : hwloc_get_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, (unsigned)node);
}

ppn_status ppn_topo_bind_self(ppn_topo *t, int pu, int node)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    if (pu < 0) hwloc_bitmap_copy(set, hwloc_topology_get_topology_cpuset(t->h));
    else hwloc_bitmap_only(set, (unsigned)pu);
    int rc = hwloc_set_cpubind(t->h, set, HWLOC_CPUBIND_THREAD), e = errno;
    ppn_status st = PPN_OK;
    if (rc != 0) st = ppn_err(PPN_EINVAL, "topo: cannot pin thread to PU %d: %s", pu, strerror(e));
    hwloc_obj_t n = node_obj(t, node);
    if (st == PPN_OK && (node < 0 || n)) {
        /* node < 0: back to the default policy, over every node */
        hwloc_const_nodeset_t ns = n ? n->nodeset : hwloc_topology_get_topology_nodeset(t->h);
        rc = hwloc_set_membind(t->h, ns, n ? HWLOC_MEMBIND_BIND : HWLOC_MEMBIND_DEFAULT,
                               HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET | (n ? HWLOC_MEMBIND_STRICT : 0));
        e = errno;
        if (rc != 0) /* not left bound to an earlier place's node: back to the default policy */
            hwloc_set_membind(t->h, hwloc_topology_get_topology_nodeset(t->h), HWLOC_MEMBIND_DEFAULT,
                              HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
        if (rc != 0)
            st = ppn_err(PPN_EIO, "topo: thread pinned to PU %d, but binding its memory to NUMA node %d (OS node "
                         "%u) failed: %s", pu, node, n ? n->os_index : 0u, strerror(e));
    } else if (st == PPN_OK) st = ppn_err(PPN_EINVAL, "topo: NUMA node %d does not exist", node);
    hwloc_bitmap_free(set);
    return st;
}

ppn_status ppn_topo_self_mem_node(ppn_topo *t, int *node)
{
    hwloc_nodeset_t ns = hwloc_bitmap_alloc();
    hwloc_membind_policy_t pol;
    *node = -1;
    if (!ns) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    ppn_status st = PPN_OK;
    if (hwloc_get_membind(t->h, ns, &pol, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0)
        st = ppn_err(PPN_EIO, "topo: reading this thread's memory binding failed: %s", strerror(errno));
    else if (pol == HWLOC_MEMBIND_BIND && hwloc_bitmap_weight(ns) == 1) {
        hwloc_obj_t o = hwloc_get_numanode_obj_by_os_index(t->h, (unsigned)hwloc_bitmap_first(ns));
        if (o) *node = (int)o->logical_index;
    }
    hwloc_bitmap_free(ns);
    return st;
}

ppn_status ppn_topo_bind_area(ppn_topo *t, void *p, size_t n, int node)
{
    hwloc_obj_t o = node_obj(t, node);
    if (!o) return ppn_err(PPN_EINVAL, "topo: NUMA node %d does not exist", node);
    /* STRICT: a plain BIND may become MPOL_PREFERRED_MANY (hwloc >= 2.8 on kernels that have it), which spills
     * to other nodes; we want the node, and the OS to say so (MPOL_BIND). The mapping is fresh: nothing to move. */
    if (hwloc_set_area_membind(t->h, p, n, o->nodeset, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0)
        return ppn_err(PPN_EIO, "topo: binding %zu B of host memory to NUMA node %d (OS node %u) failed: %s", n, node,
                       o->os_index, strerror(errno));
    return PPN_OK;
}

ppn_status ppn_topo_interleave_area(ppn_topo *t, void *p, size_t n)
{
    if (hwloc_set_area_membind(t->h, p, n, hwloc_topology_get_topology_nodeset(t->h), HWLOC_MEMBIND_INTERLEAVE,
                               HWLOC_MEMBIND_BYNODESET) != 0)
        return ppn_err(PPN_EIO, "topo: interleaving %zu B of host memory over every node failed: %s", n,
                       strerror(errno));
    return PPN_OK;
}

ppn_status ppn_topo_area_node(ppn_topo *t, const void *p, size_t n, int *node, char *list, size_t cap)
{
    hwloc_nodeset_t ns = hwloc_bitmap_alloc();
    if (!ns) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    ppn_status st = PPN_OK;
    if (hwloc_get_area_memlocation(t->h, p, n, ns, HWLOC_MEMBIND_BYNODESET) != 0)
        st = ppn_err(PPN_EIO, "topo: asking the OS where %zu B of host memory lie failed: %s", n, strerror(errno));
    else if (hwloc_bitmap_iszero(ns)) *node = -1;
    else if (hwloc_bitmap_weight(ns) > 1) *node = -2;
    else {
        hwloc_obj_t o = hwloc_get_numanode_obj_by_os_index(t->h, (unsigned)hwloc_bitmap_first(ns));
        *node = o ? (int)o->logical_index : -3;
    }
    if (list && cap) {
        if (st == PPN_OK) hwloc_bitmap_list_snprintf(list, cap, ns);
        else list[0] = '\0';
    }
    hwloc_bitmap_free(ns);
    return st;
}

ppn_status ppn_topo_thread_cpus(ppn_topo *t, pid_t tid, char *buf, size_t cap)
{
    hwloc_cpuset_t set = hwloc_bitmap_alloc();
    if (!set) return ppn_err(PPN_ENOMEM, "topo: host out of memory");
    ppn_status st = PPN_OK;
    if (hwloc_get_proc_cpubind(t->h, tid, set, HWLOC_CPUBIND_THREAD) != 0)
        st = ppn_err(PPN_EIO, "topo: reading thread %d's CPU binding failed: %s", (int)tid, strerror(errno));
    else hwloc_bitmap_list_snprintf(buf, cap, set);
    hwloc_bitmap_free(set);
    return st;
}
