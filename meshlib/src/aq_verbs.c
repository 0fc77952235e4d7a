/*
 * Application-posted writes over verbs (proto/ring.h, the AQ area, MESH_AQ_PATH_RDMA): the
 * channel's sending half posted by the application itself, on an RC QP of its own connected to the
 * peer application's, so that no meshd stands between a message and the wire. meshd offers it (the rail's device and path in the control
 * page), relays the two QPs' numbers and keys, grants the half once both QPs are connected and its
 * own writes are done, and revokes it when its link or rail goes; everything else (credits, the
 * stream's accounting, resuming) stays meshd's.
 *
 * What we post for bytes [posted, tx_prod): where the peer's libmesh takes positions in immediates
 * (MESH_AQ_CAP_IMM_POS), WRITE_WITH_IMMs of at most AQ_CHUNK into the same offsets of the peer's RX
 * area, each naming where it ends; otherwise one RDMA WRITE per contiguous run of the TX area, then
 * the direct pair {pos, check} into the peer's control page by WRITE_WITH_IMM (inline, signalled).
 * RC executes one QP's messages in order, so a reader that sees a position has the bytes below it,
 * and the immediate wakes a reader that sleeps on its completion channel. tx_prod is published to
 * meshd with each chain, just before its post, and never moves back (tx_show: bytes published
 * before meshd's grant stay published while chains cover them). TX bytes are reused only
 * once meshd's tx_cons (the peer's reader) and our own completions both passed them.
 *
 * Receiving, the peer's pairs land in our control page, where rx_sync reads them as any direct
 * pair; each one consumes one of our posted receives (refilled as completions are polled).
 *
 * Everything meshd wrote into the AQ area is hostile: checked before use. Any failure of ours (no
 * device access, a QP that errs, a forked child) makes us say MESH_AQ_IDLE once nothing of our QP is
 * in flight: meshd then posts the half again from what the peer's reader has. MESH_APP_SEND=off in
 * the environment keeps libmesh from offering at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "aq_int.h"

#define AQ_RQ 128      /* receives for the peer's pairs or immediates (a reader slow to refill: RNR) */
#define AQ_CQ (AQ_SQ + AQ_RQ)
#define AQ_REFILL 16   /* receives posted at once: one call of the provider (and its lock) for all */
#define AQ_WR_RECV 0ull /* wr_id of a receive; a pair's is (pos << 1) | 1 */
#define AQ_WR_DATA 2ull /* of a data write: unsignalled, seen only when flushed in error */
#define AQ_CHUNK (64u << 10)       /* largest write when positions ride in immediates (aq_flush_imm) */
#define AQ_CHUNK_FIRST (16u << 10) /* the first one's when nothing of ours is in flight */
#define AQ_BATCH 16          /* writes per chain there (a fifo entry counts at most 255) */
/* Writes up to this size go inline, where the device takes that much: the bytes travel in the work
 * request, and the device need not read them from the ring (perftest's latency tests do the same). */
#define AQ_INLINE 256

/* One verbs context and protection domain per device, shared by this process's channels: a context
 * costs two descriptors and a scan of the devices in sysfs, which a server with a thousand
 * connections (under the preload library) would otherwise pay per channel, and its descriptors
 * out of the program's own RLIMIT_NOFILE. Opened by the first channel on the device, closed with
 * the last; a forked child opens its own (the parent's are not its to use, nor to close). */
struct aq_dev {
	char name[MESH_AQ_DEV_LEN];
	unsigned gen;   /* aq_gen() when opened */
	unsigned users; /* channels of ours on it */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
};

#define AQ_DEVS 16 /* devices one process posts on at once; more: meshd posts for the rest */

static struct aq_dev aq_devs[AQ_DEVS];
static pthread_mutex_t aq_devs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t aq_devs_once = PTHREAD_ONCE_INIT;

/* The table's lock is held across fork, so a child never inherits it locked by a thread it lacks. */
static void aq_before_fork(void)
{
	pthread_mutex_lock(&aq_devs_lock);
}

static void aq_after_fork(void)
{
	pthread_mutex_unlock(&aq_devs_lock);
}

static void aq_devs_register_fork(void)
{
	if (pthread_atfork(aq_before_fork, aq_after_fork, aq_after_fork))
		lib_debug("pthread_atfork failed: a forked child could inherit the device table locked");
}

/* MESH_APP_SEND=pairs: a direct pair after each batch, as libmesh did before MESH_AQ_CAP_IMM_POS
 * (to compare the two; both ends must agree, so it only stops offering the cap). */
static bool aq_env_pairs(void)
{
	const char *v = getenv("MESH_APP_SEND");

	return v && !strcmp(v, "pairs");
}

static struct ibv_context *aq_open_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	if (!list)
		return NULL;
	errno = ENODEV;
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name)) {
			ctx = ibv_open_device(list[i]);
			break;
		}
	ibv_free_device_list(list);
	return ctx;
}

/* The device's shared context and PD, opened if no channel of this process holds them; NULL with
 * errno when it cannot be opened. */
static struct aq_dev *aq_dev_get(const char *name)
{
	unsigned gen = aq_gen();
	struct aq_dev *d = NULL, *free_slot = NULL;

	pthread_once(&aq_devs_once, aq_devs_register_fork);
	pthread_mutex_lock(&aq_devs_lock);
	for (int i = 0; i < AQ_DEVS; i++) {
		struct aq_dev *e = &aq_devs[i];

		if (e->users && e->gen == gen && !strcmp(e->name, name)) {
			d = e;
			break;
		}
		if (!free_slot && (!e->users || e->gen != gen))
			free_slot = e; /* unused, or the parent's: forgotten here, never closed */
	}
	if (!d && free_slot) {
		struct ibv_context *ctx = aq_open_device(name);
		struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;

		if (pd) {
			d = free_slot;
			memset(d, 0, sizeof(*d));
			memcpy(d->name, name, sizeof(d->name));
			d->gen = gen;
			d->ctx = ctx;
			d->pd = pd;
		} else if (ctx) {
			int err = errno;

			ibv_close_device(ctx);
			errno = err;
		}
	} else if (!d) {
		lib_debug("this process posts on %d RDMA devices already: not on %s too", AQ_DEVS, name);
		errno = EMFILE;
	}
	if (d)
		d->users++;
	pthread_mutex_unlock(&aq_devs_lock);
	return d;
}

static void aq_dev_put(struct aq_dev *d)
{
	pthread_mutex_lock(&aq_devs_lock);
	if (--d->users == 0) {
		ibv_dealloc_pd(d->pd);
		ibv_close_device(d->ctx);
		d->pd = NULL;
		d->ctx = NULL;
	}
	pthread_mutex_unlock(&aq_devs_lock);
}

/* A forked child's lib_aq is freed without this: the verbs objects are its parent's. */
static void aqv_destroy(struct lib_aq *q)
{
	if (!aq_mine(q))
		return;
	if (q->qp)
		ibv_destroy_qp(q->qp);
	if (q->mr_tx)
		ibv_dereg_mr(q->mr_tx);
	if (q->mr_rx)
		ibv_dereg_mr(q->mr_rx);
	if (q->mr_dir)
		ibv_dereg_mr(q->mr_dir);
	if (q->cq)
		ibv_destroy_cq(q->cq);
	if (q->cch)
		ibv_destroy_comp_channel(q->cch);
	if (q->dev)
		aq_dev_put(q->dev);
}

/* A QP of our own on the device and port meshd's path names, offered to meshd. */
static int aqv_open(mesh_channel_t *c, struct lib_aq *q)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct ibv_qp_init_attr qi = {0};
	struct ibv_qp_attr qa = {0};
	char dev[MESH_AQ_DEV_LEN];
	uint32_t psn;
	int ret;

	memcpy(dev, a->dev, sizeof(dev));
	if (!memchr(dev, '\0', sizeof(dev)) || !a->port || a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096) {
		lib_debug("channel %u: meshd's path for application-posted writes is not valid", c->info.channel_id);
		return -EINVAL;
	}
	q->dev = aq_dev_get(dev);
	if (!q->dev) {
		ret = -errno;
		lib_debug("channel %u: cannot open RDMA device %s (%s): meshd posts our writes", c->info.channel_id, dev,
			  strerror(-ret));
		return ret ? ret : -ENODEV;
	}
	q->cch = ibv_create_comp_channel(q->dev->ctx);
	q->cq = q->cch ? ibv_create_cq(q->dev->ctx, AQ_CQ, NULL, q->cch, 0) : NULL;
	if (!q->cq)
		goto err_verbs;
	if (fcntl(q->cch->fd, F_SETFL, fcntl(q->cch->fd, F_GETFL) | O_NONBLOCK))
		goto err_verbs;
	q->mr_tx = ibv_reg_mr(q->dev->pd, c->tx, c->size, IBV_ACCESS_LOCAL_WRITE);
	q->mr_rx = ibv_reg_mr(q->dev->pd, c->rx, c->size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	q->mr_dir = ibv_reg_mr(q->dev->pd, mesh_ring_direct(c->ctrl), MESH_RING_DIRECT_LEN,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!q->mr_tx || !q->mr_rx || !q->mr_dir)
		goto err_verbs;
	qi.send_cq = qi.recv_cq = q->cq;
	qi.qp_type = IBV_QPT_RC;
	qi.cap.max_send_wr = AQ_SQ;
	qi.cap.max_recv_wr = AQ_RQ;
	qi.cap.max_send_sge = qi.cap.max_recv_sge = 1;
	qi.cap.max_inline_data = AQ_INLINE;
	q->qp = ibv_create_qp(q->dev->pd, &qi);
	if (!q->qp) {
		qi.cap.max_inline_data = MESH_RING_DIRECT_LEN; /* a device with less inline room */
		q->qp = ibv_create_qp(q->dev->pd, &qi);
	}
	if (!q->qp)
		goto err_verbs;
	q->max_inline = qi.cap.max_inline_data < AQ_INLINE ? qi.cap.max_inline_data : AQ_INLINE;
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = a->port;
	qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(q->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		goto err_verbs;
	if (getrandom(&psn, sizeof(psn), 0) != sizeof(psn))
		psn = (uint32_t)getpid() * 2654435761u;
	a->qpn = q->qp->qp_num;
	a->psn = psn & 0xffffff;
	a->rx_addr = (uintptr_t)c->rx;
	a->rx_rkey = q->mr_rx->rkey;
	a->dir_addr = (uintptr_t)mesh_ring_direct(c->ctrl);
	a->dir_rkey = q->mr_dir->rkey;
	a->caps = MESH_AQ_CAP_TAKE | (aq_env_pairs() ? 0 : MESH_AQ_CAP_IMM_POS);
	aq_say(c, MESH_AQ_OFFER);
	return 0;
err_verbs:
	ret = errno ? -errno : -EIO;
	lib_debug("channel %u: cannot set up a QP of our own on %s (%s): meshd posts our writes", c->info.channel_id,
		  dev, strerror(errno));
	return ret; /* the caller destroys q, with whatever of it was made */
}

/* The peer's QP is known: ours goes to RTS, with the receives its pairs consume. */
static int aq_connect(mesh_channel_t *c)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);
	struct lib_aq *q = c->aq;
	struct ibv_qp_attr qa = {0};
	uint32_t qpn = a->peer_qpn, psn = a->peer_psn;

	if (qpn > 0xffffff || psn > 0xffffff || !a->peer_rx_rkey || !a->peer_dir_rkey) {
		lib_debug("channel %u: meshd's peer QP %u PSN %u keys %u/%u are not valid", c->info.channel_id, qpn, psn,
			  a->peer_rx_rkey, a->peer_dir_rkey);
		return -EPROTO;
	}
	q->peer_rx_addr = a->peer_rx_addr;
	q->peer_rx_rkey = a->peer_rx_rkey;
	q->peer_dir_addr = a->peer_dir_addr;
	q->peer_dir_rkey = a->peer_dir_rkey;
	q->imm_pos = (a->peer_caps & MESH_AQ_CAP_IMM_POS) && !aq_env_pairs();
	qa.qp_state = IBV_QPS_RTR;
	qa.path_mtu = (enum ibv_mtu)a->path_mtu;
	qa.dest_qp_num = qpn;
	qa.rq_psn = psn;
	qa.max_dest_rd_atomic = 1;
	qa.min_rnr_timer = 1; /* 0.01 ms: a receive is refilled within a poll */
	qa.ah_attr.is_global = 1;
	memcpy(qa.ah_attr.grh.dgid.raw, a->dgid, sizeof(a->dgid));
	qa.ah_attr.grh.sgid_index = a->sgid_index;
	qa.ah_attr.grh.hop_limit = a->hop_limit ? a->hop_limit : 64;
	qa.ah_attr.grh.traffic_class = a->traffic_class;
	qa.ah_attr.port_num = a->port;
	if (ibv_modify_qp(q->qp, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -errno;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_RTS;
	qa.timeout = a->ack_timeout ? a->ack_timeout : 14;
	qa.retry_cnt = 7;
	qa.rnr_retry = 7; /* a reader slow to refill its receives holds our writes back, never fails them */
	qa.sq_psn = a->psn;
	qa.max_rd_atomic = 1;
	if (ibv_modify_qp(q->qp, &qa, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return -errno;
	return 0;
}

/* Keeps AQ_RQ receives posted for the peer's immediates, AQ_REFILL at a time once that many are
 * used: a post per message was a call into the provider, and its lock, per message. */
static void aq_refill(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_recv_wr wr[AQ_REFILL], *bad;
	uint32_t n = AQ_RQ - q->rq_posted;

	if (n < AQ_REFILL && q->rq_posted)
		return; /* plenty left: the next poll posts a whole batch */
	for (; n; n = AQ_RQ - q->rq_posted) {
		uint32_t k = n < AQ_REFILL ? n : AQ_REFILL;

		for (uint32_t i = 0; i < k; i++)
			wr[i] = (struct ibv_recv_wr){.wr_id = AQ_WR_RECV, .next = i + 1 < k ? &wr[i + 1] : NULL};
		if (ibv_post_recv(q->qp, wr, &bad)) {
			for (uint32_t i = 0; i < k && bad != &wr[i]; i++)
				q->rq_posted++;
			return;
		}
		q->rq_posted += k;
	}
}

/* A peer's write whose immediate carries its end position (MESH_AQ_CAP_IMM_POS): RC placed it and
 * every write before it on the QP. The position is within a ring of our reader (the peer writes
 * no further than our credit), which resolves its upper bits; anything else is ignored, as a pair
 * would be. meshd reads rx_seen for its accounting, as it would the pair. */
static void aq_seen(mesh_channel_t *c, uint32_t imm)
{
	struct lib_aq *q = c->aq;
	uint64_t pos;

	if (!(imm & MESH_AQ_IMM_POS))
		return; /* a pair's: its words are in the page */
	pos = c->rx_cons + ((imm - (uint32_t)c->rx_cons) & MESH_AQ_IMM_MASK);
	if (pos <= q->rx_seen || pos > c->rx_cons + c->size)
		return;
	q->rx_seen = pos;
	atomic_store_explicit(&mesh_ring_aq(c->ctrl)->rx_seen, pos, memory_order_release);
}

/* Drains the CQ: pairs completed (their writes with them), receives consumed. */
static void aq_poll(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(q->cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS && !q->qp_err) {
				lib_debug("channel %u: our QP failed: %s", c->info.channel_id, ibv_wc_status_str(wc[i].status));
				q->failed = q->qp_err = true;
			}
			if (wc[i].wr_id == AQ_WR_RECV) {
				q->rq_posted--;
				if (wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM)
					aq_seen(c, ntohl(wc[i].imm_data));
				continue;
			}
			if (wc[i].wr_id == AQ_WR_DATA) {
				/* A flushed data write of the oldest batch: its pair comes next. */
				q->sq_out--;
				if (q->fifo_len && q->fifo[q->fifo_head] > 1)
					q->fifo[q->fifo_head]--;
				continue;
			}
			if (wc[i].status == IBV_WC_SUCCESS && (wc[i].wr_id >> 1) > q->done)
				q->done = wc[i].wr_id >> 1;
			if (q->fifo_len) {
				q->sq_out -= q->fifo[q->fifo_head];
				q->fifo_head = (q->fifo_head + 1) % AQ_SQ;
				q->fifo_len--;
			}
		}
	}
	if (n < 0)
		q->failed = q->qp_err = true;
	/* Also after we gave our half back: the peer's writes may still come until it hears. */
	if (!q->qp_err)
		aq_refill(c);
}

/* Posts one chain of n work requests whose last (signalled) covers the stream up to pos, and
 * publishes pos. */
static bool aq_post(mesh_channel_t *c, struct ibv_send_wr *wr, int n, uint64_t pos)
{
	struct lib_aq *q = c->aq;
	struct ibv_send_wr *bad;

	/* Published before the post: rxe does the NIC's work inside ibv_post_send, so the peer may have
	 * the bytes, read them and credited them to meshd before the post returns, and meshd takes a
	 * credit only for what it knows was published. A post that fails hands the half back, and
	 * meshd then writes from what the peer has. Bytes published before the grant stay published
	 * while the chains that cover them go, one by one. */
	tx_show(c, pos);
	if (ibv_post_send(q->qp, wr, &bad)) {
		/* Those before `bad` were posted: their completions (flushed, once the QP stops) are
		 * counted down like any. */
		lib_debug("channel %u: posting our writes failed: %s", c->info.channel_id, strerror(errno));
		for (int i = 0; i < n && bad != &wr[i]; i++)
			q->sq_out++;
		q->failed = true;
		return false;
	}
	q->sq_out += (uint32_t)n;
	q->fifo[(q->fifo_head + q->fifo_len) % AQ_SQ] = (uint8_t)n;
	q->fifo_len++;
	q->posted = pos;
	return true;
}

/* The published bytes from pos that one write can take: up to tx_prod, within one run of the ring. */
static uint64_t aq_run(const mesh_channel_t *c, uint64_t pos)
{
	uint64_t len = c->tx_prod - pos;

	return len < mesh_ring_contig(pos, c->size) ? len : mesh_ring_contig(pos, c->size);
}

/* One RDMA WRITE of the TX bytes [pos, pos + len) to the same offset of the peer's RX area. */
static void aq_write_wr(mesh_channel_t *c, struct ibv_send_wr *wr, struct ibv_sge *sg, uint64_t pos, uint64_t len)
{
	struct lib_aq *q = c->aq;
	uint64_t off = pos & (c->size - 1);

	*sg = (struct ibv_sge){.addr = (uintptr_t)(c->tx + off), .length = (uint32_t)len, .lkey = q->mr_tx->lkey};
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = AQ_WR_DATA;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->sg_list = sg;
	wr->num_sge = 1;
	wr->wr.rdma.remote_addr = q->peer_rx_addr + off;
	wr->wr.rdma.rkey = q->peer_rx_rkey;
	wr->next = wr + 1;
}

/* Where the peer takes positions in immediates (MESH_AQ_CAP_IMM_POS): [posted, tx_prod) in writes
 * of at most AQ_CHUNK, each a WRITE_WITH_IMM naming where it ends, in chains of at most AQ_BATCH,
 * the last one signalled. When nothing of ours is in flight the first write is AQ_CHUNK_FIRST: the
 * reader has it while the rest is still on the wire (a blocking 64 KiB echo then answers with its
 * first bytes before its last arrive, as rsocket's segments allow). A streaming sender always has
 * writes in flight and posts whole 64 KiB ones: every write is a receive completion at the reader,
 * and 16 KiB pieces throughout cost a stream a tenth of its rate. Everything published goes now,
 * unless the send queue is full: its completions wake whoever waits, and the next poll posts the
 * rest. */
static void aq_flush_imm(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_send_wr wr[AQ_BATCH];
	struct ibv_sge sg[AQ_BATCH];
	uint64_t chunk = q->sq_out ? AQ_CHUNK : AQ_CHUNK_FIRST;

	while (q->posted < c->tx_prod && !q->failed) {
		uint64_t pos = q->posted;
		int n = 0;

		if (q->sq_out + AQ_BATCH > AQ_SQ || q->fifo_len == AQ_SQ)
			return; /* the next poll makes room: every caller polls before it waits */
		while (n < AQ_BATCH && pos < c->tx_prod) {
			uint64_t len = aq_run(c, pos);

			if (len > chunk)
				len = chunk;
			chunk = AQ_CHUNK;
			aq_write_wr(c, &wr[n], &sg[n], pos, len);
			pos += len;
			wr[n].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr[n].imm_data = htonl(MESH_AQ_IMM_POS | (uint32_t)(pos & MESH_AQ_IMM_MASK));
			if (len <= q->max_inline)
				wr[n].send_flags = IBV_SEND_INLINE;
			n++;
		}
		wr[n - 1].wr_id = (pos << 1) | 1;
		wr[n - 1].send_flags |= IBV_SEND_SIGNALED;
		wr[n - 1].next = NULL;
		if (!aq_post(c, wr, n, pos))
			return;
	}
}

/* Posts [posted, tx_prod) and its pair as one chain; publishes what went. */
static void aq_flush(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_send_wr wr[3];
	struct ibv_sge sg[3];
	uint64_t pair[2];
	uint64_t pos = q->posted;
	int n = 0;

	if (!q->owned || q->failed || pos == c->tx_prod)
		return;
	if (q->imm_pos) {
		aq_flush_imm(c);
		return;
	}
	if (q->sq_out + 3 > AQ_SQ || q->fifo_len == AQ_SQ)
		return; /* the next poll makes room: every caller polls before it waits */
	while (pos < c->tx_prod) {
		uint64_t len = aq_run(c, pos);

		aq_write_wr(c, &wr[n], &sg[n], pos, len);
		pos += len;
		n++;
	}
	pair[0] = pos;
	pair[1] = mesh_ring_direct_check(pos);
	sg[n] = (struct ibv_sge){.addr = (uintptr_t)pair, .length = MESH_RING_DIRECT_LEN};
	memset(&wr[n], 0, sizeof(wr[n]));
	wr[n].wr_id = (pos << 1) | 1;
	wr[n].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr[n].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	wr[n].sg_list = &sg[n];
	wr[n].num_sge = 1;
	wr[n].imm_data = 0;
	wr[n].wr.rdma.remote_addr = q->peer_dir_addr;
	wr[n].wr.rdma.rkey = q->peer_dir_rkey;
	wr[n].next = NULL;
	aq_post(c, wr, n + 1, pos);
}

/* Stops our QP for good: in the error state it sends nothing more (no retransmission of an old
 * write can land in the peer's ring after meshd wrote there again, however long the QP's own
 * retries would have lasted) and every work request still queued completes at once, flushed. */
static void aq_stop(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};

	q->owned = false;
	q->failed = true;
	if (q->connected && !q->qp_err && aq_mine(q)) {
		if (ibv_modify_qp(q->qp, &qa, IBV_QP_STATE))
			lib_debug("channel %u: cannot stop our QP: %s", c->info.channel_id, strerror(errno));
		q->qp_err = true;
	}
}

static void aqv_progress(mesh_channel_t *c)
{
	struct mesh_ring_aq *a;
	struct lib_aq *q = c->aq;
	uint64_t from;
	uint32_t v;

	if (q->state == MESH_AQ_IDLE && (!q->connected || !aq_mine(q)))
		return;
	a = mesh_ring_aq(c->ctrl);
	if (q->state == MESH_AQ_IDLE) {
		aq_poll(c); /* our half is meshd's; the peer's pairs may still come until it hears */
		return;
	}
	if (!aq_mine(q)) {
		/* A forked child: the QP is its parent's. It hands the half back (its parent, if it
		 * still sends, is revoked with it); meshd posts for both from then on. */
		q->sq_out = 0;
		aq_give_back(c);
		return;
	}
	if (q->state == MESH_AQ_OFFER && atomic_load_explicit(&a->peer_state, memory_order_acquire) >= MESH_AQ_PEER_INFO) {
		int ret = aq_connect(c);

		if (ret) {
			lib_debug("channel %u: connecting our QP failed: %s", c->info.channel_id, strerror(-ret));
			q->failed = true;
		} else {
			q->connected = true;
			aq_refill(c);
			aq_say(c, MESH_AQ_READY);
		}
	}
	if (q->connected)
		aq_poll(c);
	if (aq_grant_take(c, &v, &from)) {
		q->done = from;
		lib_debug("channel %u: we post our writes from %" PRIu64 " (round %u, %s)", c->info.channel_id, from,
			  q->round, q->imm_pos ? "positions in immediates" : "pairs");
	} else if (v == MESH_AQ_REVOKED && (q->owned || !q->failed)) {
		aq_stop(c); /* IDLE once its queue is flushed; meshd may offer a new round after */
		aq_poll(c);
	}
	if (q->owned)
		aq_flush(c);
	if (q->failed && !q->qp_err && q->sq_out)
		aq_stop(c); /* failed otherwise (a post): nothing of it may land later either */
	if (q->failed && q->state != MESH_AQ_IDLE && (q->sq_out == 0 || q->state == MESH_AQ_OFFER))
		aq_give_back(c);
}

/* A send step is the whole step on a QP. */
static int aqv_progress_send(mesh_channel_t *c)
{
	(void)c;
	return -EOPNOTSUPP;
}

static int aqv_fd(const struct lib_aq *q)
{
	return q->cch->fd;
}

static int aqv_wait_fd(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;

	/* A QP in error still completes what it had queued (flushed): until all of that is in, we
	 * cannot say IDLE, and meshd, waiting for it, has nothing to wake us for. So the CQ stays
	 * in the sleep while anything of ours is outstanding. */
	if (!q->connected || (q->qp_err && !q->sq_out) || !aq_mine(q))
		return -1;
	if (!q->armed) {
		if (ibv_req_notify_cq(q->cq, 0))
			return -1;
		q->armed = true;
	}
	return q->cch->fd;
}

static void aqv_event(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	struct ibv_cq *cq;
	void *ctx;

	if (!aq_mine(q))
		return;
	while (!ibv_get_cq_event(q->cch, &cq, &ctx)) {
		ibv_ack_cq_events(cq, 1);
		q->armed = false;
	}
}

static void aqv_release(mesh_channel_t *c)
{
	struct lib_aq *q = c->aq;
	uint64_t until = aq_now_ms() + AQ_RELEASE_MS;

	if (q->state == MESH_AQ_IDLE || !aq_mine(q))
		return;
	/* A clean shutdown: the rest posted, and what we posted out, usually within a poll or two.
	 * Then the QP stops (a peer gone quiet: within AQ_RELEASE_MS), and meshd writes whatever did
	 * not arrive again, from what the peer's reader has. The peer's own writes to us fail from then
	 * on, and its meshd takes its half back too. */
	aq_flush(c);
	while ((q->sq_out || (q->owned && q->posted != c->tx_prod)) && q->connected && !q->qp_err &&
	       aq_now_ms() < until) {
		sched_yield();
		aq_poll(c);
		aq_flush(c);
	}
	aq_stop(c);
	for (int i = 0; i < 1000 && q->sq_out && q->connected; i++)
		aq_poll(c); /* the flushed ones: immediate */
	q->sq_out = 0;
	aq_give_back(c);
}

const struct aq_ops aq_verbs_ops = {
	.name = "verbs",
	.look_is_syscall = false,
	.open = aqv_open,
	.destroy = aqv_destroy,
	.progress = aqv_progress,
	.progress_send = aqv_progress_send,
	.fd = aqv_fd,
	.wait_fd = aqv_wait_fd,
	.event = aqv_event,
	.release = aqv_release,
};
