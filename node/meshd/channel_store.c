/*
 * Channels kept across a restart of meshd (docs/design.md, "Restarting meshd with channels kept").
 * A channel to another node, once it is OPEN and its application has it, hands its four
 * descriptors (the ring's memfd, the kick and wake eventfds, meshd's end of the lifeline) to the
 * service manager's descriptor store (sd_notify FDSTORE=1: systemd, or meshd-keeper), and takes
 * them out again when it is freed. What meshd must know of the channel beyond the ring travels in
 * the ring descriptor's name: its record (peer, slots, ports, owner, role, QPs, provider, ring
 * size, the peer meshd's boot epoch). The name is written by meshd alone and held by the manager;
 * the application can write the ring's page, never the record. Names and descriptors go together
 * in one datagram, so a meshd killed at any moment leaves a channel kept whole or not at all.
 *
 * The next meshd is given the store (LISTEN_FDS, LISTEN_FDNAMES) and restores every channel whose
 * four descriptors and record are there and agree with the configuration and the ring: RESUMING
 * on its link, its positions read off the ring (channel.c, channel_restore). Its Hello names the
 * meshd it succeeds (mesh.predecessor_epoch, kept in the store too), and the peers resume those
 * channels instead of failing them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "channel.h"
#include "channel_internal.h"
#include "log.h"
#include "mesh.h"
#include "ring.h"
#include "util.h"

/* The format's version: a meshd reads its own and refuses (fails) channels of others. */
#define STORE_FMT "mc1"
#define STORE_NAME_MAX 256 /* systemd's FDNAME is at most 255 characters */

static const char *const kept_kinds[CH_KEPT_FDS] = {"ring", "kick", "wake", "life"};

/* The name of one of the channel's descriptors in the store; the ring's carries the record. */
static void store_name(const struct channel *ch, int kind, char *buf, size_t len)
{
	if (kind != CH_KEPT_RING) {
		snprintf(buf, len, STORE_FMT ".%u.%s", ch->id, kept_kinds[kind]);
		return;
	}
	snprintf(buf, len, STORE_FMT ".%u.ring.%u.%u.%u.%u.%u.%u.%u.%u.%u.%" PRIu64 ".%" PRIu64, ch->id, ch->peer_node,
		 ch->slot, ch->peer_slot, ch->local_port, ch->peer_port, ch->owner_uid, ch->opener, ch->qps, ch->xp,
		 ch->size, ch->peer_boot);
}

static void store_drop_names(struct mesh *m, const struct channel *ch, int upto)
{
	char name[STORE_NAME_MAX];

	for (int k = 0; k < upto; k++) {
		store_name(ch, k, name, sizeof(name));
		m->store.drop(m->store.ctx, name);
	}
}

void channel_store_keep(struct channel *ch)
{
	struct mesh *m = ch->mesh;
	int fds[CH_KEPT_FDS] = {ch->memfd, ch->kick_fd, ch->wake_fd, ch->life_fd};
	char name[STORE_NAME_MAX];

	if (!m->store.keep || ch->local || ch->kept || ch->state != CH_OPEN)
		return;
	for (int k = 0; k < CH_KEPT_FDS; k++) {
		int ret;

		store_name(ch, k, name, sizeof(name));
		ret = fds[k] < 0 ? -EBADF : m->store.keep(m->store.ctx, name, &fds[k], 1);
		if (ret) {
			log_warn("channel %u (node %u port %u): cannot keep its descriptors for a restart: %s; it ends "
				 "with this meshd",
				 ch->id, ch->peer_node, ch->peer_port, mesh_strerror(ret));
			store_drop_names(m, ch, k);
			return;
		}
	}
	ch->kept = true;
	m->store.n_kept++;
}

void channel_store_drop(struct channel *ch)
{
	struct mesh *m = ch->mesh;

	/* A handover leaves them to the next meshd. */
	if (!ch->kept || m->store.handover)
		return;
	store_drop_names(m, ch, CH_KEPT_FDS);
	ch->kept = false;
	m->store.n_kept--;
}

void channel_store_rename(struct channel *ch, uint64_t peer_boot)
{
	bool kept = ch->kept;

	channel_store_drop(ch);
	ch->peer_boot = peer_boot;
	if (kept)
		channel_store_keep(ch); /* under the name that says the new epoch */
}

void channel_store_keep_listener(struct mesh *m, struct listener *li)
{
	char name[STORE_NAME_MAX];
	int ret;

	if (!m->store.keep || li->kept)
		return;
	if (m->store.restoring) {
		li->kept = true; /* in the store already, under this name */
		return;
	}
	snprintf(name, sizeof(name), STORE_FMT ".listen.%u", li->port);
	ret = m->store.keep(m->store.ctx, name, &li->fd, 1);
	if (ret)
		log_warn("port %u: cannot keep its listener for a restart: %s; it ends with this meshd", li->port,
			 mesh_strerror(ret));
	li->kept = !ret;
}

void channel_store_drop_listener(struct mesh *m, struct listener *li)
{
	char name[STORE_NAME_MAX];

	if (!li->kept || m->store.handover)
		return;
	snprintf(name, sizeof(name), STORE_FMT ".listen.%u", li->port);
	m->store.drop(m->store.ctx, name);
	li->kept = false;
}

/* ---- the next meshd: restoring what the last one kept ---- */

/* "mc1.<id>.<kind>[.record]": the id and the kind's index, and where the record starts. -1: not ours. */
static int parse_head(const char *name, uint32_t *id, const char **rest)
{
	char *end;
	unsigned long v;

	if (strncmp(name, STORE_FMT ".", sizeof(STORE_FMT)))
		return -1;
	name += sizeof(STORE_FMT);
	errno = 0;
	v = strtoul(name, &end, 10);
	if (errno || end == name || *end != '.' || !v || v > UINT32_MAX)
		return -1;
	*id = (uint32_t)v;
	for (int k = 0; k < CH_KEPT_FDS; k++) {
		size_t n = strlen(kept_kinds[k]);

		if (!strncmp(end + 1, kept_kinds[k], n) && (end[1 + n] == '\0' || end[1 + n] == '.')) {
			*rest = end + 1 + n;
			return k;
		}
	}
	return -1;
}

/* The ring's record: 11 numbers, each within its field's range. */
static bool parse_record(const char *s, uint32_t id, struct channel_record *r)
{
	uint64_t v[11];
	const uint64_t max[11] = {UINT32_MAX, MESH_CHANNEL_SLOTS - 1, MESH_CHANNEL_SLOTS - 1, UINT16_MAX, UINT16_MAX,
				  UINT32_MAX, 1, MESH_QPS_PER_LINK_MAX, MESH_XPORTS_MAX - 1, MESH_RING_MAX, UINT64_MAX};

	for (int i = 0; i < 11; i++) {
		char *end;

		if (*s != '.' || s[1] < '0' || s[1] > '9')
			return false;
		errno = 0;
		v[i] = strtoull(s + 1, &end, 10);
		if (errno || v[i] > max[i])
			return false;
		s = end;
	}
	if (*s)
		return false;
	memset(r, 0, sizeof(*r));
	r->id = id;
	r->peer_node = (uint32_t)v[0];
	r->slot = (uint32_t)v[1];
	r->peer_slot = (uint32_t)v[2];
	r->local_port = (uint16_t)v[3];
	r->peer_port = (uint16_t)v[4];
	r->uid = (uint32_t)v[5];
	r->opener = v[6];
	r->qps = (uint32_t)v[7];
	r->xp = (uint8_t)v[8];
	r->size = v[9];
	r->peer_boot = v[10];
	return true;
}

/* Whether the record fits this meshd's configuration: a peer it knows, QPs and a provider it has, a
 * ring of a size it makes. NULL, or the link. */
static struct link *record_link(struct mesh *m, const struct channel_record *r, const char **why)
{
	struct link *l = r->peer_node == m->self->id ? NULL : mesh_link_find(m, r->peer_node);

	if (!l)
		*why = "its peer is not a node of the configuration";
	else if (!r->qps || r->qps > m->cfg->qps_per_link)
		*why = "its QPs do not fit cluster.qps_per_link";
	else if (r->xp >= m->n_xports)
		*why = "its provider is not one of this meshd";
	else if (!mesh_ring_size_valid(r->size))
		*why = "its ring size is not one meshd makes";
	else
		return l;
	return NULL;
}

/* The entries of one channel id, by kind: their index in the store's list, -1 absent. */
static void find_kinds(char *const *names, const bool *taken, size_t n, uint32_t id, ssize_t at[CH_KEPT_FDS])
{
	for (int k = 0; k < CH_KEPT_FDS; k++)
		at[k] = -1;
	for (size_t i = 0; i < n; i++) {
		const char *rest;
		uint32_t eid;
		int k;

		if (!taken[i] && (k = parse_head(names[i], &eid, &rest)) >= 0 && eid == id && at[k] < 0)
			at[k] = (ssize_t)i;
	}
}

/* One channel of the store, its entries taken (taken[i]); 0 or -errno said. */
static int restore_one(struct mesh *m, const int *fds, char *const *names, bool *taken, size_t n, size_t ring,
		       uint32_t id, const char *record)
{
	struct channel_record r;
	ssize_t at[CH_KEPT_FDS];
	int own[CH_KEPT_FDS], err = -EINVAL;
	const char *why = "its record does not parse";
	struct channel *ch;
	struct link *l = NULL;
	bool whole = true;

	find_kinds(names, taken, n, id, at);
	at[CH_KEPT_RING] = (ssize_t)ring;
	for (int k = 0; k < CH_KEPT_FDS; k++) {
		own[k] = at[k] < 0 ? -1 : fds[at[k]];
		whole &= at[k] >= 0;
	}
	if (parse_record(record, id, &r) && (l = record_link(m, &r, &why)) && !whole) {
		why = "some of its descriptors are missing";
		l = NULL;
	}
	if (l && channel_find(m, id)) {
		why = "another kept channel has its id";
		l = NULL;
	}
	if (l && (ch = channel_restore(l, &r, own, &why, &err))) {
		ch->kept = true;
		for (int k = 0; k < CH_KEPT_FDS; k++)
			taken[at[k]] = true; /* the channel's now, kept under the same names */
		return 0;
	}
	log_warn("channel %u kept by the last meshd cannot be restored: %s; it fails", id, why);
	for (int k = 0; k < CH_KEPT_FDS; k++) {
		if (at[k] < 0)
			continue;
		m->store.drop(m->store.ctx, names[at[k]]);
		if (!l)
			close(own[k]); /* channel_restore closed them when it had them */
		taken[at[k]] = true;
	}
	return err;
}

/* A listening client's connection: served again, listening on its port (the client's uid from
 * the connection itself, SO_PEERCRED, as at any accept). Takes fd; 0, or -errno said (its name
 * is then dropped from the store). */
static int restore_listener(struct mesh *m, int fd, const char *name, const char *port_s)
{
	char *end;
	unsigned long port;
	int ret = -EINVAL;

	errno = 0;
	port = strtoul(port_s, &end, 10);
	if (!errno && end != port_s && !*end && port <= UINT16_MAX && m->chans->ch_ops.adopt)
		ret = m->chans->ch_ops.adopt(m->chans->ch_ops.ctx, fd, (uint16_t)port);
	else
		close(fd);
	if (ret)
		m->store.drop(m->store.ctx, name);
	if (ret)
		log_warn("listener on port %s kept by the last meshd cannot be restored: %s; its application's accept "
			 "fails",
			 port_s, mesh_strerror(ret));
	else
		log_info("listener on port %lu kept by the last meshd listens again", port);
	return ret;
}

/* The store's other entries: the epoch of the meshd that kept them, and strays (a descriptor of a
 * channel whose ring is not there), which go. */
static void restore_rest(struct mesh *m, const int *fds, char *const *names, bool *taken, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (taken[i])
			continue;
		if (!strncmp(names[i], STORE_FMT ".epoch.", sizeof(STORE_FMT) + 6)) {
			uint64_t e = strtoull(names[i] + sizeof(STORE_FMT) + 6, NULL, 10);

			m->predecessor_epoch = MAX(m->predecessor_epoch, e);
		} else if (!strncmp(names[i], STORE_FMT ".listen.", sizeof(STORE_FMT) + 7)) {
			/* The listener's now, kept under the same name, or closed and dropped. */
			restore_listener(m, fds[i], names[i], names[i] + sizeof(STORE_FMT) + 7);
			taken[i] = true;
			continue;
		} else {
			log_warn("descriptor \"%s\" in the store is no channel's: dropped", names[i]);
		}
		m->store.drop(m->store.ctx, names[i]);
		close(fds[i]);
		taken[i] = true;
	}
}

/* Says this meshd's boot epoch in the store: the next one names it as its predecessor. */
static void store_epoch(struct mesh *m)
{
	char name[STORE_NAME_MAX];
	int fd = eventfd(0, EFD_CLOEXEC);

	if (fd < 0)
		return;
	snprintf(name, sizeof(name), STORE_FMT ".epoch.%" PRIu64, m->boot_epoch);
	if (m->store.keep(m->store.ctx, name, &fd, 1))
		log_warn("cannot keep this meshd's epoch in the store: a restart fails its channels at the peers");
	close(fd);
}

int channel_store_restore(struct mesh *m, const int *fds, char *const *names, size_t n)
{
	uint32_t restored = 0, failed = 0;
	bool *taken = calloc(n + 1, sizeof(*taken));

	if (!taken) {
		log_error("out of memory: the channels kept by the last meshd fail");
		for (size_t i = 0; i < n; i++)
			close(fds[i]);
		return 0;
	}

	for (size_t i = 0; i < n; i++) {
		const char *rest;
		uint32_t id;

		if (taken[i] || parse_head(names[i], &id, &rest) != CH_KEPT_RING)
			continue;
		if (restore_one(m, fds, names, taken, n, i, id, rest))
			failed++;
		else
			restored++;
	}
	m->store.restoring = true;
	restore_rest(m, fds, names, taken, n);
	m->store.restoring = false;
	free(taken);
	if (!m->store.keep)
		return 0;
	store_epoch(m);
	if (restored || failed)
		log_info("restored %u channel%s kept by the meshd started at %" PRIu64 " us%s", restored,
			 restored == 1 ? "" : "s", m->predecessor_epoch, failed ? "; others failed (above)" : "");
	m->store.n_kept = restored;
	return (int)restored;
}
