#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "numa_topo.h"
#include "util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* ---- cpulists ---- */

static int parse_uint(const char **p, unsigned long *v)
{
	char *end;

	if (!isdigit((unsigned char)**p))
		return -EINVAL;
	errno = 0;
	*v = strtoul(*p, &end, 10);
	if (errno || *v >= CPU_SETSIZE)
		return -EINVAL;
	*p = end;
	return 0;
}

int numa_cpulist_parse(const char *s, cpu_set_t *set)
{
	const char *p = s;

	CPU_ZERO(set);
	while (*p && *p != '\n') {
		unsigned long a, b;

		if (parse_uint(&p, &a))
			return -EINVAL;
		b = a;
		if (*p == '-') {
			p++;
			if (parse_uint(&p, &b) || b < a)
				return -EINVAL;
		}
		for (unsigned long c = a; c <= b; c++)
			CPU_SET(c, set);
		if (*p == ',')
			p++;
		else if (*p && *p != '\n')
			return -EINVAL;
	}
	if (p > s && p[-1] == ',')
		return -EINVAL;
	if (*p == '\n' && p[1])
		return -EINVAL;
	return 0;
}

char *numa_cpulist_format(const cpu_set_t *set, char *buf, size_t len)
{
	size_t n = 0;

	if (!len)
		return buf;
	buf[0] = 0;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		int e = c;

		if (!CPU_ISSET(c, set))
			continue;
		while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
			e++;
		if (n < len)
			n += (size_t)snprintf(buf + n, len - n, e > c ? "%s%d-%d" : "%s%d", n ? "," : "", c, e);
		c = e;
	}
	return buf;
}

/* ---- sysfs ---- */

static int read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	return 0;
}

/* A node number file ("-1\n", "0\n"): the node, -1, or -EINVAL. */
static int parse_node(const char *s)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || (*end && strcmp(end, "\n")) || v < -1 || v >= NUMA_NODES_MAX)
		return -EINVAL;
	return (int)v;
}

static int read_node(const char *path, int *node)
{
	char buf[32];
	int ret = read_small(path, buf, sizeof(buf));

	if (ret)
		return ret;
	ret = parse_node(buf);
	if (ret < -1)
		return ret;
	*node = ret;
	return 0;
}

int numa_netdev_node(const char *root, const char *ifname)
{
	char path[PATH_MAX];
	int node = -1;

	if (!ifname[0] || strchr(ifname, '/') || !strcmp(ifname, ".") || !strcmp(ifname, ".."))
		return -1;
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/device/numa_node", root ? root : "", ifname);
	if (!read_node(path, &node))
		return node;
	/* virtio-net: the netdev's device is the virtio device, the PCI function is its parent. */
	snprintf(path, sizeof(path), "%s/sys/class/net/%s/device/../numa_node", root ? root : "", ifname);
	return read_node(path, &node) ? -1 : node;
}

static int topo_fail(char *why, size_t len, const char *path, int err)
{
	snprintf(why, len, "%s: %s", path, err == -EINVAL ? "malformed" : strerror(-err));
	return err;
}

static int load_nodes(struct numa_topo *t, const char *root, char *why, size_t whylen)
{
	char path[PATH_MAX], buf[4096];
	cpu_set_t nodes;
	int ret;

	snprintf(path, sizeof(path), "%s/sys/devices/system/node/online", root);
	ret = read_small(path, buf, sizeof(buf));
	if (ret == -ENOENT) {
		/* A kernel without NUMA: one node with every online CPU. */
		snprintf(path, sizeof(path), "%s/sys/devices/system/cpu/online", root);
		ret = read_small(path, buf, sizeof(buf));
		if (ret || numa_cpulist_parse(buf, &t->cpus[0]))
			return topo_fail(why, whylen, path, ret ? ret : -EINVAL);
		t->online[0] = true;
		t->n_nodes = t->n_online = 1;
		return 0;
	}
	if (ret || numa_cpulist_parse(buf, &nodes))
		return topo_fail(why, whylen, path, ret ? ret : -EINVAL);
	for (int n = 0; n < CPU_SETSIZE; n++) {
		if (!CPU_ISSET(n, &nodes))
			continue;
		if (n >= NUMA_NODES_MAX)
			return topo_fail(why, whylen, path, -EINVAL);
		snprintf(path, sizeof(path), "%s/sys/devices/system/node/node%d/cpulist", root, n);
		ret = read_small(path, buf, sizeof(buf));
		if (ret || numa_cpulist_parse(buf, &t->cpus[n]))
			return topo_fail(why, whylen, path, ret ? ret : -EINVAL);
		t->online[n] = true;
		t->n_nodes = n + 1;
		t->n_online++;
	}
	if (!t->n_online)
		return topo_fail(why, whylen, "no online NUMA node", -EINVAL);
	return 0;
}

static int load_devs(struct numa_topo *t, const char *root, char *why, size_t whylen)
{
	char path[PATH_MAX], buf[64];
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	snprintf(path, sizeof(path), "%s/sys/class/infiniband", root);
	dir = opendir(path);
	if (!dir)
		return 0; /* no RDMA device, or no RDMA in this kernel */
	while ((de = readdir(dir)) && t->n_devs < NUMA_DEVS_MAX) {
		struct numa_dev *d = &t->devs[t->n_devs];

		if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(d->name))
			continue;
		memset(d, 0, sizeof(*d));
		util_strlcpy(d->name, de->d_name, sizeof(d->name));
		d->node = -1;
		snprintf(path, sizeof(path), "%s/sys/class/infiniband/%s/device/numa_node", root, d->name);
		ret = read_node(path, &d->node);
		if (ret == -ENOENT) {
			/* Soft-RoCE: no device of its own; the netdev under it has one (or none). */
			snprintf(path, sizeof(path), "%s/sys/class/infiniband/%s/parent", root, d->name);
			ret = read_small(path, buf, sizeof(buf));
			if (!ret) {
				buf[strcspn(buf, "\n")] = 0;
				util_strlcpy(d->netdev, buf, sizeof(d->netdev));
				d->node = numa_netdev_node(root, d->netdev);
			} else if (ret == -ENOENT) {
				ret = 0;
			}
		}
		if (ret) {
			topo_fail(why, whylen, path, ret);
			break;
		}
		if (d->node >= t->n_nodes || (d->node >= 0 && !t->online[d->node]))
			d->node = -1; /* a node we cannot place on is no affinity */
		t->n_devs++;
	}
	closedir(dir);
	return ret;
}

int numa_topo_load(struct numa_topo *t, const char *root, char *why, size_t whylen)
{
	int ret;

	memset(t, 0, sizeof(*t));
	if (!root || !strcmp(root, "/"))
		root = "";
	ret = load_nodes(t, root, why, whylen);
	if (!ret)
		ret = load_devs(t, root, why, whylen);
	return ret;
}

const struct numa_dev *numa_topo_dev(const struct numa_topo *t, const char *name)
{
	for (size_t i = 0; i < t->n_devs; i++)
		if (!strcmp(t->devs[i].name, name))
			return &t->devs[i];
	return NULL;
}

/* ---- policy ---- */

bool numa_usable(const struct numa_topo *t, bool libnuma_ok, const char **why)
{
	if (!libnuma_ok) {
		*why = "libnuma is not available at run time (no NUMA support in this kernel)";
		return false;
	}
	if (t->n_online < 2) {
		*why = "this machine has one NUMA node: placement changes nothing";
		return false;
	}
	*why = "";
	return true;
}

int numa_home(const struct numa_topo *t, bool usable, int mode, int dev_node, const char **why)
{
	if (mode == NUMA_OFF) {
		*why = "numa is off (configuration)";
		return -1;
	}
	if (!usable)
		return -1; /* *why from numa_usable */
	if (mode >= 0) {
		if (mode < t->n_nodes && t->online[mode]) {
			*why = "the configuration names this node";
			return mode;
		}
		*why = "the configuration names a node this machine does not have: unplaced";
		return -1;
	}
	if (dev_node >= 0 && dev_node < t->n_nodes && t->online[dev_node]) {
		*why = "the device's node";
		return dev_node;
	}
	*why = "the device has no NUMA affinity (numa_node -1): unplaced";
	return -1;
}

int numa_channel_node(const struct numa_topo *t, bool usable, int home, int hint)
{
	if (hint < 0)
		return home;
	if (hint >= t->n_nodes || !t->online[hint])
		return -EINVAL;
	return usable ? hint : -1;
}

unsigned numa_rail_pick(const int *rail_node, unsigned n_rails, int want)
{
	if (want < 0)
		return 0;
	for (unsigned r = 0; r < n_rails; r++)
		if (rail_node[r] == want)
			return r;
	return 0;
}

int numa_ring_node(const struct numa_topo *t, bool usable, bool by_device, int home, int dev_node, int hint)
{
	if (hint >= 0)
		return numa_channel_node(t, usable, home, hint);
	if (usable && by_device && dev_node >= 0 && dev_node < t->n_nodes && t->online[dev_node])
		return dev_node;
	return home;
}

/* ---- run time ---- */

bool numa_lib_ok(void)
{
	return numa_available() >= 0;
}

int numa_place(void *addr, size_t len, int node)
{
	unsigned long mask[NUMA_NODES_MAX / (8 * sizeof(unsigned long)) + 1] = {0};
	long page = sysconf(_SC_PAGESIZE);

	if (node < 0 || node >= NUMA_NODES_MAX || !len)
		return 0;
	mask[(unsigned)node / (8 * sizeof(unsigned long))] |= 1ul << ((unsigned)node % (8 * sizeof(unsigned long)));
	if (mbind(addr, len, MPOL_PREFERRED, mask, NUMA_NODES_MAX + 1, 0))
		return -errno;
	/* Fault in now: the policy applies at allocation, and pages must exist before a peer can
	 * write into them or a registration pins them. */
	if (madvise(addr, len, MADV_POPULATE_WRITE)) {
		for (size_t off = 0; off < len; off += (size_t)page) {
			volatile uint8_t *p = (volatile uint8_t *)addr + off;

			*p = *p;
		}
	}
	return 0;
}

int numa_page_node(const void *addr)
{
	int node = -1;

	if (get_mempolicy(&node, NULL, 0, (void *)addr, MPOL_F_NODE | MPOL_F_ADDR))
		return -1;
	return node;
}

int numa_pages_node(const void *const *addrs, size_t n)
{
	int status[8], node = -1;
	void *pages[8];
	long page = sysconf(_SC_PAGESIZE);

	if (!n || n > ARRAY_SIZE(pages))
		return -1;
	for (size_t i = 0; i < n; i++)
		pages[i] = (void *)((uintptr_t)addrs[i] & ~(uintptr_t)(page - 1));
	/* nodes NULL: only asks where each page is. */
	if (move_pages(0, (unsigned long)n, pages, NULL, status, 0))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (status[i] < 0)
			return -1;
		if (i && status[i] != node)
			return -2;
		node = status[i];
	}
	return node;
}
