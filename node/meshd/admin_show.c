/*
 * What the control socket shows (meshctl node, links, channels, ports, metrics): NodeInfo,
 * LinkInfo and ChannelInfo filled from the mesh, the lists in pages that fit a datagram, the
 * metrics text in pages, and the snapshot the data path publishes so that NODE and LINKS are
 * answered while it is busy. The one file that reads links and channels for display.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "admin.h"
#include "admin_int.h"
#include "channel.h"
#include "log.h"
#include "util.h"

/* ---- NodeInfo, LinkInfo, ChannelInfo ---- */

static void fill_node(struct mesh *m, NodeInfo *n, char *version)
{
	const struct mesh_chans *cs = m->chans;

	n->id = m->self->id;
	n->cluster = (char *)m->cfg->cluster_name;
	n->cluster_hash = m->cluster_hash;
	n->addr = (char *)m->self->addr;
	n->port = m->self->port;
	n->transport = m->xport_names;
	n->boot_epoch = m->boot_epoch;
	n->uptime_ms = util_now_ms() - m->start_ms;
	n->peers = (uint32_t)m->n_links;
	n->links_up = mesh_links_up(m);
	n->qps_per_link = m->cfg->qps_per_link;
	n->config_path = (char *)m->cfg->path;
	n->config_generation = m->conf.generation;
	n->config_loaded_us = m->conf.loaded_us;
	n->config_reloads = m->conf.reloads;
	n->config_refused = m->conf.refused;
	n->config_error = (char *)m->conf.error;
	n->log_level = (char *)log_level_name(log_current_level);
	n->draining = cs->draining;
	n->drain_left_ms =
		cs->draining && cs->drain_deadline_ms > util_now_ms() ? cs->drain_deadline_ms - util_now_ms() : 0;
	n->channels = cs->n_channels;
	n->fd_store = m->store.keep != NULL;
	n->channels_kept = m->store.n_kept;
	n->predecessor_epoch = m->predecessor_epoch;
	n->pid = (uint32_t)getpid();
	n->version = version;
	n->peer_rejects = m->peer_rejects;
	n->link_flaps = m->link_flaps;
	n->channel_resumes = m->channel_resumes;
	n->rail_failovers = m->rail_failovers;
	n->handshakes = m->handshakes;
	n->dial_window = mesh_dial_window(m);
	n->handshake_ms = m->adm.srtt_ms;
	n->admission_cuts = m->adm.cuts;
}

static void fill_numa(struct mesh *m, NodeInfo *n, struct numa_show *b)
{
	const struct mesh_numa *nu = &m->numa;
	cpu_set_t set;

	n->numa = (char *)(m->self->numa[0] ? m->self->numa : m->cfg->numa);
	n->numa_usable = nu->usable;
	n->numa_nodes = (uint32_t)nu->topo.n_online;
	n->numa_home = nu->home;
	n->numa_why = (char *)(nu->why ? nu->why : "");
	for (size_t i = 0; i < nu->n_devs; i++) {
		NumaDevice *d = &b->devs[i];
		int node = nu->devs[i].node;

		numa_device__init(d);
		d->name = (char *)nu->devs[i].name;
		d->provider = (char *)nu->devs[i].provider;
		d->netdev = (char *)nu->devs[i].netdev;
		d->rail = nu->devs[i].rail;
		d->address = (char *)mesh_node_addr(m->self, nu->devs[i].rail);
		d->numa_node = node;
		d->cpus = node >= 0 ? numa_cpulist_format(&nu->topo.cpus[node], b->dcpus[i], sizeof(b->dcpus[i])) : "";
		b->dptrs[i] = d;
	}
	n->n_devices = nu->n_devs;
	n->devices = b->dptrs;
	for (size_t r = 0; r < nu->n_threads; r++) {
		DataPathThread *th = &b->th[r];

		if (!nu->threads[r].tid)
			continue; /* not started (unit tests drive the loop themselves) */
		data_path_thread__init(th);
		th->name = (char *)nu->threads[r].name;
		th->tid = nu->threads[r].tid;
		th->devices = (char *)nu->threads[r].devices;
		th->numa_node = nu->threads[r].node;
		th->rail = (uint32_t)r;
		th->polling = (char *)m->cfg->polling;
		th->poll_budget_us = m->cfg->poll_budget_us;
		th->fast_events = nu->threads[r].fast_events;
		th->deferred_events = nu->threads[r].deferred_events;
		th->slow_sections = nu->threads[r].slow_sections;
		th->kicks = nu->threads[r].kicks;
		/* Asked of the kernel, not remembered: what the thread really may run on. */
		if (!sched_getaffinity((pid_t)th->tid, sizeof(set), &set))
			th->cpus = numa_cpulist_format(&set, b->tcpus[r], sizeof(b->tcpus[r]));
		else
			th->cpus = "";
		b->tptr[n->n_threads++] = th;
	}
	n->threads = b->tptr;
}

/* The whole NodeInfo of this node, its strings in b. */
void admin_fill_node_show(struct mesh *m, NodeInfo *n, struct numa_show *b)
{
	snprintf(b->version, sizeof(b->version), "%d.%d", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
	fill_node(m, n, b->version);
	fill_numa(m, n, b);
}

/* What the control socket itself counts, at the moment of the reply. */
void admin_fill_ctl_counters(struct admin *a, NodeInfo *n)
{
	n->ctl_errors = atomic_load(&a->errors);
	n->snapshot_replies = atomic_load(&a->snapshot_replies);
	n->queued_replies = atomic_load(&a->queued_replies);
	n->ctl_priority = atomic_load(&a->rt_now);
	n->ctl_demotions = atomic_load(&a->rt_demotions);
	n->ctl_tid = atomic_load(&a->tid);
}

static void fill_link(struct mesh *m, struct link *l, LinkInfo *li, MailboxInfo *mb)
{
	enum link_state s = link_state(l);

	li->peer = l->peer->id;
	li->peer_addr = (char *)l->peer->addr;
	li->peer_port = l->peer->port;
	li->state = s == LINK_STATE_UP_ ? LINK_STATE__LINK_STATE_UP
		    : s == LINK_STATE_CONNECTING_ ? LINK_STATE__LINK_STATE_CONNECTING
						   : LINK_STATE__LINK_STATE_DOWN;
	li->dialer = l->dialer;
	li->qps = link_qps_established(l);
	li->qps_configured = mesh_link_qps(m); /* on every rail */
	li->rails = m->n_rails;
	if (l->phase == LINK_UP) {
		li->rails_up = (uint32_t)__builtin_popcount(l->rails_up);
	} else {
		for (uint32_t r = 0; r < m->n_rails; r++) {
			uint64_t rail_qps = ((1ull << m->cfg->qps_per_link) - 1) << (r * m->cfg->qps_per_link);

			li->rails_up += (l->est_mask & rail_qps) == rail_qps;
		}
	}
	li->rail_failovers = l->rail_failovers;
	li->rail_error = l->rail_last_error;
	li->ctl_rail = l->ctl_rail;
	li->epoch = l->epoch;
	li->rtt_us = l->rtt_us;
	if (l->phase >= LINK_PROOF) {
		mb->addr = l->peer_mb_addr;
		mb->len = l->peer_mb_len;
		mb->rkey = l->peer_mb_rkey;
	}
	li->mailbox = mb;
	li->transport = (char *)link_transport(l);
	li->state_ms = util_now_ms() - l->shown_ms;
	li->ups = l->ups;
	li->attempts = l->failures;
	li->last_error = l->last_error;
	li->down_error = l->down_error;
	li->peer_boot_epoch = l->peer_boot_epoch;
	li->tx_msgs = l->tx_msgs;
	li->rx_msgs = l->rx_msgs;
}

static void fill_channel(struct mesh *m, const struct channel *ch, ChannelInfo *ci)
{
	ci->id = ch->id;
	ci->local_node = m->self->id;
	ci->local_port = ch->local_port;
	ci->peer_node = ch->peer_node; /* never what the application's shared page says */
	ci->peer_port = ch->peer_port;
	ci->owner_uid = ch->owner_uid;
	ci->opener = ch->opener;
	ci->state = (char *)channel_state_name(ch);
	ci->qps = ch->qps;
	ci->ring_size = ch->size;
	ci->tx_bytes = ch->tx_bytes;
	ci->rx_bytes = ch->rx_bytes_total;
	ci->tx_chunks = ch->tx_chunks;
	ci->rx_chunks = ch->rx_chunks;
	ci->in_flight = ch->inflight;
	ci->credit_stalls = ch->credit_stalls;
	ci->resumes = ch->resumes;
	ci->rewritten_bytes = ch->rewritten_bytes;
	ci->rail_moves = ch->rail_moves;
	ci->tx_pending = ch->app_tx_prod - ch->tx_sent;
	/* The application may have read ahead of rx_bytes (a direct pair): nothing unread then. */
	ci->rx_unread = ch->rx_bytes > ch->app_rx_cons ? ch->rx_bytes - ch->app_rx_cons : 0;
	ci->direct_writes = ch->direct_writes;
	ci->direct_paused = channel_pairs_paused(ch);
	ci->pair_hints = ch->hint_writes;
	ci->writer = !ch->aq_granted ? "meshd" : ch->aq_untaken ? "offered" : "app";
	ci->peer_app_writes = ch->aq_peer_sends;
	ci->app_grants = ch->aq_grants;
	ci->app_withdrawn = ch->aq_withdrawn;
	ci->error = (char *)ch->why;
	ci->numa_want = ch->numa_want;
	ci->rail = ch->rail;
	ci->device = "";
	for (size_t i = 0; ch->link && !ch->local && i < m->numa.n_devs; i++)
		if (m->numa.devs[i].rail == ch->rail && !strcmp(m->numa.devs[i].provider, link_transport(ch->link)))
			ci->device = (char *)m->numa.devs[i].name;
	if (ch->ctrl) {
		const void *pages[3] = {ch->ctrl, ch->tx, ch->rx};

		ci->numa_node = numa_pages_node(pages, 3);
	} else {
		ci->numa_node = -1;
	}
}

/* ---- the metrics text, in pages ---- */

int admin_metrics_render(struct admin *a, struct metrics_buf *b)
{
	struct metrics_extra x = {
		.ctl_errors = atomic_load(&a->errors), .http_scrapes = a->http_scrapes, .http_renders = a->http_renders};

	return metrics_render(a->mesh, &x, b);
}

/* One page of the metrics text: at offset 0 rendered afresh for this client, later offsets from
 * the same text, so the pages fit together. */
static void admin_metrics_page(struct admin *a, int slot, const CtlRequest *req, CtlReply *r, MetricsPage *page)
{
	uint64_t off = req->offset;

	if (!off) {
		struct metrics_buf b = {0};

		admin_metrics_forget(a, slot);
		if (admin_metrics_render(a, &b)) {
			metrics_buf_free(&b);
			r->status = -ENOMEM;
			r->error = "out of memory rendering the metrics";
			return;
		}
		a->metrics_text[slot] = metrics_buf_take(&b, &a->metrics_len[slot]);
	} else if (!a->metrics_text[slot] || off >= a->metrics_len[slot]) {
		/* The client's own mistake: nothing of meshd's state is involved, nothing logged. */
		r->status = -EINVAL;
		r->error = a->metrics_text[slot] ? "metrics offset beyond the text"
						 : "no metrics text on this connection: ask for offset 0 first";
		return;
	}
	page->offset = off;
	page->total = a->metrics_len[slot];
	page->text.data = (uint8_t *)a->metrics_text[slot] + off;
	page->text.len = MIN(a->metrics_len[slot] - off, (uint64_t)ADMIN_METRICS_PAGE);
	r->metrics = page;
}

/* ---- the lists, in pages (CTL_OP_SHOW) ---- */

/* The pages of the lists: the items of a reply, from the request's offset while they fit
 * ADMIN_LIST_PAGE bytes (CtlReply.total: a reply must fit one datagram, and a cluster may have any
 * number of links). The arrays are the caller's to free (struct admin_page), also on -ENOMEM. */
struct admin_page {
	LinkInfo *lis, **lptrs;
	MailboxInfo *mbs;
	ChannelInfo *cis, **cptrs;
	PortInfo *pis, **pptrs;
};

static int admin_page_links(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	size_t nl = a->mesh->n_links, bytes = 0;

	r->total = (uint32_t)nl;
	pg->lis = calloc(nl, sizeof(*pg->lis));
	pg->lptrs = calloc(nl, sizeof(*pg->lptrs));
	pg->mbs = calloc(nl, sizeof(*pg->mbs));
	if (!pg->lis || !pg->lptrs || !pg->mbs)
		return -ENOMEM;
	for (uint64_t i = req->offset; i < nl; i++) {
		LinkInfo *li = &pg->lis[r->n_links];

		link_info__init(li);
		mailbox_info__init(&pg->mbs[r->n_links]);
		fill_link(a->mesh, a->mesh->links[i], li, &pg->mbs[r->n_links]);
		bytes += link_info__get_packed_size(li) + 4;
		if (r->n_links && bytes > ADMIN_LIST_PAGE)
			break;
		pg->lptrs[r->n_links++] = li;
	}
	r->links = pg->lptrs;
	return 0;
}

static int admin_page_channels(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	const struct mesh_chans *cs = a->mesh->chans;
	uint64_t skip = req->offset;
	size_t bytes = 0;

	r->total = cs->n_channels;
	pg->cis = calloc(cs->n_channels, sizeof(*pg->cis));
	pg->cptrs = calloc(cs->n_channels, sizeof(*pg->cptrs));
	if (!pg->cis || !pg->cptrs)
		return -ENOMEM;
	for (struct channel *ch = cs->channels; ch && r->n_channels < cs->n_channels; ch = ch->next) {
		ChannelInfo *ci = &pg->cis[r->n_channels];

		if (skip) {
			skip--;
			continue;
		}
		channel_info__init(ci);
		fill_channel(a->mesh, ch, ci);
		bytes += channel_info__get_packed_size(ci) + 4;
		if (r->n_channels && bytes > ADMIN_LIST_PAGE)
			break;
		pg->cptrs[r->n_channels++] = ci;
	}
	r->channels = pg->cptrs;
	return 0;
}

static int admin_page_ports(struct admin *a, const CtlRequest *req, CtlReply *r, struct admin_page *pg)
{
	uint64_t skip = req->offset;
	size_t np = 0, bytes = 0;

	for (const struct listener *li = a->mesh->chans->listeners; li; li = li->next)
		np++;
	r->total = (uint32_t)np;
	pg->pis = calloc(np ? np : 1, sizeof(*pg->pis));
	pg->pptrs = calloc(np ? np : 1, sizeof(*pg->pptrs));
	if (!pg->pis || !pg->pptrs)
		return -ENOMEM;
	for (const struct listener *li = a->mesh->chans->listeners; li; li = li->next) {
		PortInfo *pi = &pg->pis[r->n_ports];
		int cs = admin_slot_of(a, li->fd); /* its own fd: only the pid, set at accept */

		if (skip) {
			skip--;
			continue;
		}
		port_info__init(pi);
		pi->port = li->port;
		pi->owner_uid = li->uid;
		pi->owner_pid = cs >= 0 ? a->client_pid[cs] : 0;
		for (const struct channel *ch = a->mesh->chans->channels; ch; ch = ch->next)
			pi->channels += !ch->opener && ch->local_port == li->port;
		bytes += port_info__get_packed_size(pi) + 4;
		if (r->n_ports && bytes > ADMIN_LIST_PAGE)
			break;
		pg->pptrs[r->n_ports++] = pi;
	}
	r->ports = pg->pptrs;
	return 0;
}

/* Any other request (CTL_OP_SHOW): the node, with one page of the list its object names (links,
 * channels, ports, the metrics text). 0, or the failed reply's error (the caller drops the client). */
int admin_show(struct admin *a, int slot, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo node = NODE_INFO__INIT;
	struct admin_page pg = {0};
	struct numa_show numa;
	MetricsPage page = METRICS_PAGE__INIT;
	int ret = 0;

	admin_fill_node_show(a->mesh, &node, &numa);
	admin_fill_ctl_counters(a, &node);
	r.node = &node;
	if (req->object == CTL_OBJECT__CTL_OBJECT_LINKS && a->mesh->n_links)
		ret = admin_page_links(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_CHANNELS && a->mesh->chans->n_channels)
		ret = admin_page_channels(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_PORTS)
		ret = admin_page_ports(a, req, &r, &pg);
	else if (req->object == CTL_OBJECT__CTL_OBJECT_METRICS)
		admin_metrics_page(a, slot, req, &r, &page);
	if (ret) {
		ret = admin_reply_error(a, slot, fd, ret, "out of memory");
		goto out;
	}
	ret = admin_send_reply(fd, &r);
	/* The last page went out: the text is done with. */
	if (!ret && r.metrics && page.offset + page.text.len >= page.total)
		admin_metrics_forget(a, slot);
out:
	free(pg.lis);
	free(pg.lptrs);
	free(pg.mbs);
	free(pg.cis);
	free(pg.cptrs);
	free(pg.pis);
	free(pg.pptrs);
	return ret;
}

/* ---- the snapshot: NODE and LINKS while the data path is busy ---- */

void admin_snap_free(struct admin_snap *sn)
{
	free(sn->node);
	for (size_t i = 0; i < sn->n_links; i++)
		free(sn->links[i]);
	free(sn->links);
	free(sn->link_len);
	memset(sn, 0, sizeof(*sn));
}

void admin_snapshot(struct admin *a, uint64_t now)
{
	struct mesh *m = a->mesh;
	struct admin_snap sn = {0}, old;
	NodeInfo node = NODE_INFO__INIT;
	struct numa_show numa;
	/* (asked may be a little after now: the control thread's clock was read later.) */
	uint64_t asked = atomic_load(&a->snap_asked_ms);
	uint64_t every = asked && asked + ADMIN_SNAP_WARM_MS > now ? ADMIN_SNAP_EVERY_MS : ADMIN_SNAP_COLD_MS;

	/* Only the data path writes the snapshot: it reads its own at_ms without the lock. */
	if (a->snap.at_ms && now - a->snap.at_ms < every)
		return;
	admin_fill_node_show(m, &node, &numa);
	sn.node_len = node_info__get_packed_size(&node);
	sn.node = malloc(sn.node_len ? sn.node_len : 1);
	sn.links = calloc(m->n_links ? m->n_links : 1, sizeof(*sn.links));
	sn.link_len = calloc(m->n_links ? m->n_links : 1, sizeof(*sn.link_len));
	if (!sn.node || !sn.links || !sn.link_len)
		goto fail;
	node_info__pack(&node, sn.node);
	for (size_t i = 0; i < m->n_links; i++) {
		LinkInfo li = LINK_INFO__INIT;
		MailboxInfo mb = MAILBOX_INFO__INIT;

		fill_link(m, m->links[i], &li, &mb);
		sn.link_len[i] = link_info__get_packed_size(&li);
		sn.links[i] = malloc(sn.link_len[i] ? sn.link_len[i] : 1);
		if (!sn.links[i])
			goto fail;
		link_info__pack(&li, sn.links[i]);
		sn.n_links = i + 1;
	}
	sn.at_ms = now;
	pthread_mutex_lock(&a->snap_lock);
	old = a->snap;
	a->snap = sn;
	pthread_mutex_unlock(&a->snap_lock);
	sn = old;
fail:
	/* The old snapshot, or the new one that could not be completed (the old stays). */
	admin_snap_free(&sn);
}

/* Control thread: NODE or LINKS from the snapshot, marked with its age. 1 when there is none yet
 * (the caller queues the request), else 0 or the failed reply's error. */
int admin_snapshot_reply(struct admin *a, int fd, const CtlRequest *req)
{
	CtlReply r = CTL_REPLY__INIT;
	NodeInfo *node;
	LinkInfo **lptrs = NULL;
	uint64_t age;
	int ret;

	pthread_mutex_lock(&a->snap_lock);
	if (!a->snap.at_ms || !(node = node_info__unpack(NULL, a->snap.node_len, a->snap.node))) {
		pthread_mutex_unlock(&a->snap_lock);
		return 1;
	}
	age = util_now_ms() - a->snap.at_ms;
	atomic_fetch_add(&a->snapshot_replies, 1); /* this one counts (the control thread's only) */
	admin_fill_ctl_counters(a, node);
	node->uptime_ms += age;
	node->from_snapshot = true;
	node->snapshot_age_ms = age;
	r.node = node;
	if (req->object == CTL_OBJECT__CTL_OBJECT_LINKS && a->snap.n_links) {
		size_t nl = a->snap.n_links, bytes = 0;

		r.total = (uint32_t)nl;
		lptrs = calloc(nl, sizeof(*lptrs));
		for (uint64_t i = req->offset; lptrs && i < nl; i++) {
			LinkInfo *li = link_info__unpack(NULL, a->snap.link_len[i], a->snap.links[i]);

			if (!li)
				break;
			li->state_ms += age;
			bytes += a->snap.link_len[i] + 4;
			if (r.n_links && bytes > ADMIN_LIST_PAGE) {
				link_info__free_unpacked(li, NULL);
				break;
			}
			lptrs[r.n_links++] = li;
		}
		r.links = lptrs;
	}
	pthread_mutex_unlock(&a->snap_lock);
	ret = admin_send_reply(fd, &r);
	for (size_t i = 0; i < r.n_links; i++)
		link_info__free_unpacked(lptrs[i], NULL);
	free(lptrs);
	node_info__free_unpacked(node, NULL);
	return ret;
}
