/* test_numa.c - NUMA placement (issue 18) on machines this one is not: hwloc XML topologies of 2 and 4 packages
 * with the sim devices' PCI ids hanging off different packages, given through PPN_TOPO_XML.
 *
 * The 2-package machine is built to fit this CI box (2 PUs, 1 NUMA node: OS node 0) and to catch a mix-up of
 * logical and OS indexes: package 0 holds PU 0 and the NUMA node with OS index 1 (absent here), package 1 holds
 * PU 1 and OS node 0. Device 1 (pci 0000:02:00.0) hangs off package 0, devices 0 and 2 (01, 03) off package 1,
 * device 3 (04) nowhere. So what lands on package 1 can be pinned and bound for real here and read back from the
 * kernel (sched_getaffinity through /proc, get_mempolicy and move_pages as raw system calls, not through hwloc);
 * what lands on package 0 is checked as a decision, and the test prints what it could not check.
 * The 4-package machine (2 cores each, PUs 0-7) checks decisions only: devices 0..3 on packages 3..0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>
#include "core/rt.h"
#include "tests/util/tutil.h"

#define MPOL_DEFAULT_ 0
#define MPOL_BIND_ 2
#define MPOL_F_NODE_ 1
#define MPOL_F_ADDR_ 2

/* Topologies ------------------------------------------------------------------------------------------------ */

typedef struct pkg_spec {
    int node_os;      /* the package's NUMA node, OS index */
    int pu0, n_pu;    /* its PUs: pu0 .. pu0 + n_pu - 1 (OS indexes, one core each) */
    int bus[4], n_bus; /* the PCI buses of GPUs below it (sim device d is bus d + 1) */
} pkg_spec;

static int gp;

static void obj_sets(FILE *f, unsigned long cs, unsigned long ns)
{
    fprintf(f, "cpuset=\"0x%08lx\" complete_cpuset=\"0x%08lx\" nodeset=\"0x%08lx\" complete_nodeset=\"0x%08lx\"", cs,
            cs, ns, ns);
}

/* An hwloc v2 XML file of the packages (in cpuset order); returns its malloc'd path. */
static char *write_xml(const pkg_spec *p, int n)
{
    static int seq;
    char *path = malloc(256);
    snprintf(path, 256, "%s/ppn_numa_%d_%d.xml", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), seq++);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    unsigned long all_cs = 0, all_ns = 0;
    for (int i = 0; i < n; i++) {
        all_ns |= 1ul << p[i].node_os;
        for (int k = 0; k < p[i].n_pu; k++) all_cs |= 1ul << (p[i].pu0 + k);
    }
    gp = 1;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
               "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" ");
    obj_sets(f, all_cs, all_ns);
    fprintf(f, " allowed_cpuset=\"0x%08lx\" allowed_nodeset=\"0x%08lx\" gp_index=\"%d\">\n", all_cs, all_ns, gp++);
    for (int i = 0; i < n; i++) {
        unsigned long cs = ((1ul << p[i].n_pu) - 1) << p[i].pu0, ns = 1ul << p[i].node_os;
        fprintf(f, "<object type=\"Package\" os_index=\"%d\" ", i);
        obj_sets(f, cs, ns);
        fprintf(f, " gp_index=\"%d\">\n<object type=\"NUMANode\" os_index=\"%d\" ", gp++, p[i].node_os);
        obj_sets(f, cs, ns);
        fprintf(f, " local_memory=\"1073741824\" gp_index=\"%d\"/>\n", gp++);
        for (int k = 0; k < p[i].n_pu; k++) {
            int pu = p[i].pu0 + k;
            fprintf(f, "<object type=\"Core\" os_index=\"%d\" ", pu);
            obj_sets(f, 1ul << pu, ns);
            fprintf(f, " gp_index=\"%d\"><object type=\"PU\" os_index=\"%d\" ", gp++, pu);
            obj_sets(f, 1ul << pu, ns);
            fprintf(f, " gp_index=\"%d\"/></object>\n", gp++);
        }
        for (int b = 0; b < p[i].n_bus; b++) {
            fprintf(f, "<object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" depth=\"0\" "
                       "bridge_pci=\"0000:[%02x-%02x]\">\n", gp++, p[i].bus[b], p[i].bus[b]);
            fprintf(f, "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"0000:%02x:00.0\" "
                       "pci_type=\"0302 [10de:2335] [10de:18be] a1\" pci_link_speed=\"0.000000\"/>\n</object>\n",
                    gp++, p[i].bus[b]);
        }
        fprintf(f, "</object>\n");
    }
    fprintf(f, "</object>\n</topology>\n");
    fclose(f);
    return path;
}

/* Package 0: PU 0, OS node 1, device 1. Package 1: PU 1, OS node 0, devices 0 and 2. Device 3: nowhere. */
static char *xml_two(void)
{
    pkg_spec p[2] = {{.node_os = 1, .pu0 = 0, .n_pu = 1, .bus = {2}, .n_bus = 1},
                     {.node_os = 0, .pu0 = 1, .n_pu = 1, .bus = {1, 3}, .n_bus = 2}};
    return write_xml(p, 2);
}

/* Packages 0..3, 2 cores each (PUs 2i, 2i+1), node i; device d below package 3 - d. */
static char *xml_four(void)
{
    pkg_spec p[4];
    for (int i = 0; i < 4; i++) p[i] = (pkg_spec){.node_os = i, .pu0 = 2 * i, .n_pu = 2, .bus = {4 - i}, .n_bus = 1};
    return write_xml(p, 4);
}

/* Capture what this process writes on stderr between begin and end (malloc'd). */
static int saved_fd = -1;
static FILE *cap_file;

static void stderr_begin(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    assert_non_null(cap_file);
    saved_fd = dup(2);
    dup2(fileno(cap_file), 2);
}

static char *stderr_end(void)
{
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    long n = ftell(cap_file);
    char *s = calloc(1, (size_t)n + 1);
    rewind(cap_file);
    if (n > 0 && fread(s, 1, (size_t)n, cap_file) != (size_t)n) s[0] = 0;
    fclose(cap_file);
    return s;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* The kernel's word (raw system calls) ------------------------------------------------------------------------ */

/* The policy of the mapping holding p: mode and the first 64 nodes of its mask. */
static long vma_policy(const void *p, int *mode, unsigned long *mask)
{
    unsigned long m[16] = {0};
    long rc = syscall(SYS_get_mempolicy, mode, m, 1024ul, p, (unsigned long)MPOL_F_ADDR_);
    *mask = m[0];
    return rc;
}

/* The OS node of the page holding p (faulting it in), or -errno. */
static int page_node_get_mempolicy(const void *p)
{
    int node = -1;
    if (syscall(SYS_get_mempolicy, &node, NULL, 0ul, p, (unsigned long)(MPOL_F_NODE_ | MPOL_F_ADDR_)) != 0) return -errno;
    return node;
}

/* The OS node of the page holding p as move_pages reports it (status), or -errno of the call itself. */
static int page_node_move_pages(const void *p)
{
    void *pages[1] = {(void *)((uintptr_t)p & ~(uintptr_t)4095)};
    int status[1] = {-1};
    if (syscall(SYS_move_pages, 0, 1ul, pages, NULL, status, 0) != 0) return -errno;
    return status[0];
}

/* The thread named name: its Cpus_allowed_list from /proc (into cpus); returns 1 if found. */
static int thread_cpus(const char *name, char *cpus, size_t cap)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int found = 0;
    assert_non_null(d);
    while (!found && (e = readdir(d))) {
        char path[600], line[256];
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(line, sizeof line, f) && (line[strcspn(line, "\n")] = 0, !strcmp(line, name))) found = 1;
        fclose(f);
        if (!found) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        assert_non_null(f);
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18)) {
                char *v = line + 18;
                while (*v == ' ' || *v == '\t') v++;
                v[strcspn(v, "\n")] = 0;
                snprintf(cpus, cap, "%s", v);
            }
        fclose(f);
    }
    closedir(d);
    return found;
}

static int os_node_exists(int os)
{
    char path[64];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d", os);
    return access(path, F_OK) == 0;
}

/* Decisions on the topologies ----------------------------------------------------------------------------------- */

static ppn_gpu *sim_open(int n_dev)
{
    char v[8];
    ppn_gpu *g = NULL;
    snprintf(v, sizeof v, "%d", n_dev);
    tu_env_set("PPN_SIM_DEVICES", v);
    assert_int_equal(ppn_gpu_sim_create(NULL, &g), PPN_OK);
    return g;
}

/* Devices found from their PCI ids on the package they hang off; logical nodes, not OS ones; the device the
 * file lacks falls back to the whole machine with one notice, once. */
static void test_two_packages_place_devices(void **s)
{
    char *xml = xml_two();
    tu_env_set("PPN_TOPO_XML", xml);
    ppn_gpu *g = sim_open(4);
    ppn_topo *t = NULL;
    assert_int_equal(ppn_topo_load(&t, 0), PPN_OK); /* io 0 (sim): the file keeps its PCI objects anyway */
    assert_int_equal(ppn_topo_n_packages(t), 2);
    assert_int_equal(ppn_topo_n_numa(t), 2);
    ppn_dev_place pl;
    static const struct { int dev, pkg, node; const char *cpus; } want[] = {{0, 1, 1, "1"}, {1, 0, 0, "0"}, {2, 1, 1, "1"}};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(ppn_topo_place_device(t, g, want[i].dev, &pl), PPN_OK);
        assert_int_equal(pl.located, 1);
        assert_int_equal(pl.package, want[i].pkg);
        assert_int_equal(pl.numa_node, want[i].node);
        assert_string_equal(pl.cpuset, want[i].cpus);
    }
    stderr_begin();
    ppn_status st = ppn_topo_place_device(t, g, 3, &pl), st2 = ppn_topo_place_device(t, g, 3, &pl);
    char *err = stderr_end();
    assert_int_equal(st, PPN_OK);
    assert_int_equal(st2, PPN_OK);
    assert_int_equal(pl.located, 0);
    assert_int_equal(pl.numa_node, -1);
    assert_string_equal(pl.cpuset, "0-1");
    if (count_of(err, "ppn: notice: device 3 (pci 0000:04:00.0) has no locality") != 1 || count_of(err, "\n") != 1)
        fail_msg("want exactly one notice line for device 3, got: '%s'", err);
    free(err);
    ppn_topo_destroy(t);
    ppn_gpu_close(g);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* near: each stage on a core of its device's package; far: the next package; the node follows the core. */
static void test_four_packages_near_and_far(void **s)
{
    char *xml = xml_four();
    tu_env_set("PPN_TOPO_XML", xml);
    ppn_gpu *g = sim_open(4);
    ppn_topo *t = NULL;
    assert_int_equal(ppn_topo_load(&t, 0), PPN_OK);
    assert_int_equal(ppn_topo_n_packages(t), 4);
    int devs[4] = {0, 1, 2, 3}, pu[4], shared = 1;
    assert_int_equal(ppn_topo_pick_cores(t, g, devs, 4, pu, &shared), PPN_OK);
    assert_int_equal(shared, 0);
    for (int s2 = 0; s2 < 4; s2++) { /* device d below package 3 - d: PUs 2(3-d), 2(3-d)+1 */
        int pkg = 3 - devs[s2];
        if (pu[s2] / 2 != pkg) fail_msg("near: stage %d (dev %d) on PU %d, not package %d", s2, devs[s2], pu[s2], pkg);
        assert_int_equal(ppn_topo_pu_node(t, pu[s2]), pkg);
    }
    assert_int_equal(ppn_topo_pick_far(t, g, devs, 4, pu), PPN_OK);
    for (int s2 = 0; s2 < 4; s2++) {
        int far = (3 - devs[s2] + 1) % 4;
        if (pu[s2] / 2 != far) fail_msg("far: stage %d (dev %d) on PU %d, not package %d", s2, devs[s2], pu[s2], far);
        assert_int_equal(ppn_topo_pu_node(t, pu[s2]), far);
    }
    /* two stages on one device: distinct cores of the same package while it has them */
    int same[2] = {2, 2};
    assert_int_equal(ppn_topo_pick_cores(t, g, same, 2, pu, &shared), PPN_OK);
    assert_true(pu[0] != pu[1] && pu[0] / 2 == 1 && pu[1] / 2 == 1);
    ppn_topo_destroy(t);
    ppn_gpu_close(g);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* far on the 2-package machine is the other socket (a device of package 1 -> PU 0, of package 0 -> PU 1). */
static void test_two_packages_far_is_other_socket(void **s)
{
    char *xml = xml_two();
    tu_env_set("PPN_TOPO_XML", xml);
    ppn_gpu *g = sim_open(4);
    ppn_topo *t = NULL;
    assert_int_equal(ppn_topo_load(&t, 0), PPN_OK);
    int devs[2] = {0, 1}, pu[2], shared;
    assert_int_equal(ppn_topo_pick_cores(t, g, devs, 2, pu, &shared), PPN_OK);
    assert_int_equal(pu[0], 1);
    assert_int_equal(pu[1], 0);
    assert_int_equal(ppn_topo_pick_far(t, g, devs, 2, pu), PPN_OK);
    assert_int_equal(pu[0], 0);
    assert_int_equal(pu[1], 1);
    ppn_topo_destroy(t);
    ppn_gpu_close(g);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* Memory, read back from the kernel ----------------------------------------------------------------------------- */

/* A pinned buffer of node's arena is in a mapping bound (MPOL_BIND) to that node's OS index, and its pages are
 * there; the unbound arena's mapping has the default policy. */
static void check_bound_buffer(ppn_rt *rt, int node, int os)
{
    ppn_pinned_arena *a;
    void *p = NULL;
    assert_int_equal(ppn_rt_pinned_on(rt, node, &a), PPN_OK);
    assert_true(a != rt->pinned);
    assert_int_equal(ppn_pinned_node(a), node);
    assert_int_equal(ppn_pinned_alloc(a, 1 << 16, &p), PPN_OK);
    memset(p, 0x5a, 1 << 16);
    int mode = -1;
    unsigned long mask = 0;
    assert_int_equal(vma_policy(p, &mode, &mask), 0);
    if (mode != MPOL_BIND_ || mask != 1ul << os)
        fail_msg("node %d's buffer: policy %d mask 0x%lx, want MPOL_BIND (%d) on OS node %d", node, mode, mask,
                 MPOL_BIND_, os);
    assert_int_equal(page_node_get_mempolicy(p), os);
    int mp = page_node_move_pages((char *)p + (1 << 15));
    if (mp == -ENOSYS || mp == -EPERM) print_message("    move_pages refused here (%d): checked with get_mempolicy only\n", mp);
    else assert_int_equal(mp, os);
    assert_int_equal(ppn_pinned_bind_failed(a), 0);
    ppn_pinned_free(a, p);
}

/* This machine as it is (no PPN_TOPO_XML): the device's node arena is bound to node 0 and its pages are there. */
static void test_pinned_bound_on_this_machine(void **s)
{
    tu_env_set("PPN_TOPO_XML", NULL);
    ppn_rt *rt = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    ppn_topo *t;
    assert_int_equal(ppn_rt_topo(rt, &t), PPN_OK);
    int node = -5;
    assert_int_equal(ppn_rt_dev_node(rt, 0, &node), PPN_OK);
    if (ppn_topo_n_numa(t) != 1) print_message("    this machine has %d NUMA nodes: only node 0 is checked\n",
                                                ppn_topo_n_numa(t));
    else assert_int_equal(node, 0);
    check_bound_buffer(rt, 0, 0);
    void *p = NULL; /* the unbound arena: the default policy */
    assert_int_equal(ppn_pinned_alloc(rt->pinned, 4096, &p), PPN_OK);
    int mode = -1;
    unsigned long mask;
    assert_int_equal(vma_policy(p, &mode, &mask), 0);
    assert_int_equal(mode, MPOL_DEFAULT_);
    ppn_pinned_free(rt->pinned, p);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_env_restore();
}

/* The 2-package file: logical node 1 is OS node 0 (here: bound and checked); logical node 0 is OS node 1, which this
 * machine lacks: the binding is refused, said once, and the test says what it could not check. */
static void test_pinned_bound_logical_to_os(void **s)
{
    char *xml = xml_two();
    tu_env_set("PPN_TOPO_XML", xml);
    ppn_rt *rt = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    int node;
    assert_int_equal(ppn_rt_dev_node(rt, 0, &node), PPN_OK);
    assert_int_equal(node, 1);
    assert_int_equal(ppn_rt_dev_node(rt, 1, &node), PPN_OK);
    assert_int_equal(node, 0);
    assert_int_equal(ppn_rt_dev_node(rt, 3, &node), PPN_OK);
    assert_int_equal(node, -1);
    check_bound_buffer(rt, 1, 0);
    ppn_pinned_arena *a;
    assert_int_equal(ppn_rt_pinned_for(rt, 3, &a), PPN_OK); /* not located: the unbound arena */
    assert_ptr_equal(a, rt->pinned);
    if (os_node_exists(1)) {
        check_bound_buffer(rt, 0, 1);
    } else {
        stderr_begin();
        ppn_status st = ppn_rt_pinned_on(rt, 0, &a);
        char *err = stderr_end();
        assert_int_equal(st, PPN_OK);
        assert_int_equal(ppn_pinned_bind_failed(a), 1);
        if (count_of(err, "ppn: notice: pinned host memory for NUMA node 0 is not bound there") != 1)
            fail_msg("want one notice for node 0's arena, got '%s'", err);
        free(err);
        print_message("    NOT CHECKED here: memory landing on OS node 1 (this machine has no node 1; the binding "
                      "was refused and said so)\n");
    }
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* The runtime end to end -------------------------------------------------------------------------------------- */

static ppn_model *load_two_stages(ppn_rt *rt, int dev0, int dev1)
{
    ppn_door d = ppn_door_default();
    d.n_stages = 2;
    d.n_devices = 2;
    d.devices[0] = dev0;
    d.devices[1] = dev1;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    o.door = &d;
    return tu_model_load(rt, tu_fixture("hf/llama-tiny"), &o);
}

static void run_steps(ppn_model *m, int n)
{
    ppn_seq *q = NULL;
    float *x = malloc(sizeof(float) * 4096);
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    for (int t = 0; t < n; t++) assert_int_equal(ppn_decode_step(q, 1 + t, x), PPN_OK);
    ppn_seq_destroy(q);
    free(x);
}

static void want_thread(const char *name, const char *cpus)
{
    char got[256] = "";
    if (!thread_cpus(name, got, sizeof got)) fail_msg("no thread named %s in /proc/self/task/*/comm", name);
    if (strcmp(got, cpus)) fail_msg("thread %s: Cpus_allowed_list '%s', want '%s'", name, got, cpus);
}

/* Stage 0 on device 1 (package 0: PU 0, OS node 1), stage 1 on device 0 (package 1: PU 1, OS node 0), no peer
 * access: the threads are named and pinned near their devices (read from /proc), the host-staged slot lives on
 * the consumer's node (stage 1: OS node 0, read from the kernel), and the reports say the same; PPN_PIN=far
 * swaps the sockets. */
static void test_stages_named_pinned_and_buffers_local(void **s)
{
    char *xml = xml_two();
    tu_env_set("PPN_TOPO_XML", xml);
    tu_env_set("PPN_SIM_PEER", "none");
    tu_env_set("PPN_PIN", NULL);
    ppn_rt *rt = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    stderr_begin();
    ppn_model *m = load_two_stages(rt, 1, 0);
    char *err = stderr_end();
    run_steps(m, 3);
    want_thread("ppn-s0-dev1", "0");
    want_thread("ppn-s1-dev0", "1");
    const ppn_boundary *b = &m->bnd[0];
    assert_int_equal(b->xport, PPN_XPORT_HOST);
    for (int k = 0; k < 2; k++) {
        int mode;
        unsigned long mask;
        assert_int_equal(vma_policy(b->slot[k].host, &mode, &mask), 0);
        if (mode != MPOL_BIND_ || mask != 1ul) fail_msg("slot %d: policy %d mask 0x%lx, want bound to OS node 0", k, mode, mask);
        assert_int_equal(page_node_get_mempolicy(b->slot[k].host), 0);
    }
    ppn_stage_place p0, p1;
    assert_int_equal(ppn_model_get_stage_place(m, 0, &p0), PPN_OK);
    assert_int_equal(ppn_model_get_stage_place(m, 1, &p1), PPN_OK);
    assert_string_equal(p0.pci, "0000:02:00.0");
    assert_int_equal(p0.dev_node, 0);
    assert_string_equal(p0.thread_name, "ppn-s0-dev1");
    assert_string_equal(p0.thread_cpus, "0");
    /* read back by the thread itself: OS node 1 exists here or the binding was refused */
    assert_int_equal(p0.thread_node, os_node_exists(1) ? 0 : -1);
    assert_int_equal(p0.host_buffers, 0);
    assert_string_equal(p1.pci, "0000:01:00.0");
    assert_int_equal(p1.dev_node, 1);
    assert_string_equal(p1.thread_name, "ppn-s1-dev0");
    assert_string_equal(p1.thread_cpus, "1");
    assert_int_equal(p1.thread_node, 1);
    assert_true(p1.host_buffers >= 2); /* the two slots, and the readback of the live sequences (none now) */
    assert_int_equal(p1.host_node, 1);   /* logical 1 = OS node 0: read back, not assumed */
    assert_string_equal(p1.host_os_nodes, "0");
    if (!os_node_exists(1)) {
        if (!strstr(err, "ppn-s0-dev1: topo: thread pinned to PU 0, but binding its memory to NUMA node 0 (OS node 1)"))
            fail_msg("stage 0's memory binding to absent OS node 1 should be a notice, stderr: '%s'", err);
        print_message("    NOT CHECKED here: stage 0's thread memory on OS node 1 (absent: the binding was refused, "
                      "said, and read back as none)\n");
    }
    free(err);
    /* far: the other socket for each */
    tu_env_set("PPN_PIN", "far");
    ppn_door d = m->map->door;
    assert_int_equal(ppn_model_publish_door(m, &d), PPN_OK);
    run_steps(m, 2);
    want_thread("ppn-s0-dev1", "1");
    want_thread("ppn-s1-dev0", "0");
    assert_int_equal(ppn_model_get_stage_place(m, 1, &p1), PPN_OK);
    assert_string_equal(p1.thread_cpus, "0");
    assert_int_equal(p1.thread_node, os_node_exists(1) ? 0 : -1);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* The last stage's readback (logits, ids) is on its device's node; a device outside the file gives the unbound
 * arena, whose pages the report reads back wherever they are. */
static void test_readback_on_last_stage_node(void **s)
{
    char *xml = xml_two();
    tu_env_set("PPN_TOPO_XML", xml);
    tu_env_set("PPN_SIM_PEER", NULL);
    ppn_rt *rt = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    ppn_model *m = load_two_stages(rt, 1, 2);
    ppn_seq *q = NULL;
    float *x = malloc(sizeof(float) * 4096);
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    for (int t = 0; t < 2; t++) assert_int_equal(ppn_decode_step(q, 3 + t, x), PPN_OK);
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) {
        int mode;
        unsigned long mask;
        assert_int_equal(vma_policy(q->logits_h[i], &mode, &mask), 0);
        if (mode != MPOL_BIND_ || mask != 1ul) fail_msg("logits %d: policy %d mask 0x%lx, want OS node 0", i, mode, mask);
    }
    ppn_stage_place p1;
    assert_int_equal(ppn_model_get_stage_place(m, 1, &p1), PPN_OK);
    assert_int_equal(p1.dev_node, 1);
    assert_true(p1.host_buffers >= PPN_MAX_INFLIGHT);
    assert_int_equal(p1.host_node, 1);
    ppn_seq_destroy(q);
    free(x);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_env_restore();
    unlink(xml);
    free(xml);
}

/* The command line: ppn topo and ppn run's stage map say the same as the library. */
static void test_cli_reports(void **s)
{
    char *xml = xml_two(), env[400], args[600], *out = NULL, *err = NULL;
    snprintf(env, sizeof env, "PPN_TOPO_XML=%s PPN_SIM_PEER=none", xml);
    assert_int_equal(tu_run_ppn(env, "topo --backend sim --json", &out, &err, NULL), 0);
    if (!strstr(out, "\"id\":0,") || !strstr(out, "\"pci\":\"0000:01:00.0\"") ||
        !strstr(out, "\"numa\":1,\"package\":1,\"located\":true") || !strstr(out, "\"numa\":-1,\"package\":-1,\"located\":false") ||
        !strstr(out, "\"packages\":2"))
        fail_msg("ppn topo --json: %s", out);
    free(out);
    free(err);
    snprintf(args, sizeof args, "run --backend sim --model %s --ids 1,2,3 -n 2 --stages 2 --devices 1,0",
             tu_fixture("hf/llama-tiny"));
    assert_int_equal(tu_run_ppn(env, args, &out, &err, NULL), 0);
    if (!strstr(err, os_node_exists(1) ? "stage 0: dev1 pci 0000:02:00.0, NUMA node 0; thread ppn-s0-dev1 on PUs 0, "
                                          "memory node 0; host buffers: none"
                                        : "stage 0: dev1 pci 0000:02:00.0, NUMA node 0; thread ppn-s0-dev1 on PUs 0, "
                                          "memory not bound; host buffers: none") ||
        !strstr(err, "stage 1: dev0 pci 0000:01:00.0, NUMA node 1; thread ppn-s1-dev0 on PUs 1, memory node 1; host "
                     "buffers: 7 on node 1"))
        fail_msg("ppn run's stage map: %s", err);
    free(out);
    free(err);
    unlink(xml);
    free(xml);
}

/* The node dimension of the benchmarks: on this machine (one node) transport-bench measures the rule's
 * placement only and says why in one line; on the 2-package file it measures the three placements and reads
 * each slot's node back; sched-bench runs its slot-* arms and says when they cannot differ. */
static void test_bench_node_dimension(void **s)
{
    char *xml = xml_two(), env[400], *out = NULL, *err = NULL;
    const char *tb = "transport-bench --backend sim --devices 1,0 --sizes 4K --iters 3 --warmup 1 --batch 2 --json";
    assert_int_equal(tu_run_ppn("PPN_SIM_PEER=none", tb, &out, &err, NULL), 0);
    if (!strstr(out, "\"one_numa_node\":\"one NUMA node here") || count_of(out, "\"host_slot\":") != 1 ||
        !strstr(out, "\"host_slot\":\"consumer\",\"host_slot_node\":0"))
        fail_msg("transport-bench on one node: %s", out);
    free(out);
    free(err);
    snprintf(env, sizeof env, "PPN_TOPO_XML=%s PPN_SIM_PEER=none", xml);
    assert_int_equal(tu_run_ppn(env, tb, &out, &err, NULL), 0);
    if (strstr(out, "one_numa_node") || !strstr(out, "\"host_slot\":\"consumer\",\"host_slot_node\":1") ||
        !strstr(out, "\"host_slot\":\"producer\"") || !strstr(out, "\"host_slot\":\"interleave\""))
        fail_msg("transport-bench on 2 packages: %s", out);
    free(out);
    free(err);
    assert_int_equal(tu_run_ppn("PPN_SIM_PEER=none", "sched-bench --backend sim --shape tiny --stages 2 -n 2 "
                                "--warmup 0 --json", &out, &err, NULL), 0);
    if (!strstr(out, "\"slot_note\":\"one NUMA node here: slot-producer and slot-interleave place the same memory") ||
        !strstr(out, "\"name\":\"slot-producer\"") || !strstr(out, "\"name\":\"slot-interleave\""))
        fail_msg("sched-bench's slot arms: %s", out);
    free(out);
    free(err);
    unlink(xml);
    free(xml);
}

static int teardown(void **s)
{
    tu_env_restore();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_packages_place_devices, teardown),
        cmocka_unit_test_teardown(test_four_packages_near_and_far, teardown),
        cmocka_unit_test_teardown(test_two_packages_far_is_other_socket, teardown),
        cmocka_unit_test_teardown(test_pinned_bound_on_this_machine, teardown),
        cmocka_unit_test_teardown(test_pinned_bound_logical_to_os, teardown),
        cmocka_unit_test_teardown(test_stages_named_pinned_and_buffers_local, teardown),
        cmocka_unit_test_teardown(test_readback_on_last_stage_node, teardown),
        cmocka_unit_test_teardown(test_cli_reports, teardown),
        cmocka_unit_test_teardown(test_bench_node_dimension, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
