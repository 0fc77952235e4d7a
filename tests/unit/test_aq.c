/*
 * libmesh's application-posted writes (meshlib/src/aq.c, aq_verbs.c) over a fake of verbs.
 *
 * The fake is only what aq_verbs.c calls: one device ("fake0"), objects that are plain allocations, and a
 * QP whose post_send records every work request with the control page's tx_prod at that moment,
 * never moving a byte. The test plays meshd on the AQ area of a control page it allocated itself
 * (the peer's QP, the grant). Real QPs are exercised by the VM tests (channel_rdma_vm and the
 * rest); this is where a race between meshd and the application is made to happen on purpose.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "internal.h"
#include "unit_main.h"

/* ---- the fake of verbs ---- */

#define FAKE_WRS 1024

struct fake_wr {
	enum ibv_wr_opcode opcode;
	uint64_t off;          /* offset in the TX area (data writes) */
	uint32_t len;
	uint32_t imm;          /* host order */
	bool signalled;
	bool inlined;
	uint64_t wr_id;
	uint64_t shown;        /* the page's tx_prod when it was posted */
};

static struct {
	struct ibv_device dev;
	struct ibv_device *list[2];
	struct ibv_context ctx;
	struct ibv_pd pd;
	struct ibv_qp qp;
	struct ibv_cq cq;
	struct ibv_mr mr[3];
	int mrs;
	struct ibv_comp_channel cch;
	struct mesh_ring_ctrl *page; /* whose tx_prod each post records */
	struct fake_wr wr[FAKE_WRS];
	int nwr;
	int fail_post_at; /* the post_send call (counted from 1) that fails, 0: none */
	int posts;
	int recvs;   /* receives posted and not completed */
	int recv_calls; /* post_recv calls */
	int arrived; /* the peer's writes landed, each completing a receive while the QP works */
	uint64_t arrived_pos; /* the stream position the last of them named */
	int flushed; /* of wr[]: completed (flushed once the QP is in error) */
} fk;

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	uint64_t shown = atomic_load_explicit(&fk.page->tx_prod, memory_order_acquire);

	if (++fk.posts == fk.fail_post_at) {
		*bad = wr;
		errno = ENOMEM;
		return ENOMEM;
	}
	for (; wr; wr = wr->next) {
		struct fake_wr *f = &fk.wr[fk.nwr++];

		assert_true(fk.nwr <= FAKE_WRS);
		f->opcode = wr->opcode;
		f->len = wr->sg_list[0].length;
		f->imm = ntohl(wr->imm_data);
		f->signalled = wr->send_flags & IBV_SEND_SIGNALED;
		f->inlined = wr->send_flags & IBV_SEND_INLINE;
		f->wr_id = wr->wr_id;
		f->shown = shown;
		f->off = wr->wr.rdma.remote_addr - 0x100000000ull;
	}
	return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	fk.recv_calls++;
	for (; wr; wr = wr->next)
		fk.recvs++;
	return 0;
}

/* While the QP works only the peer's writes complete (fk.arrived of them, 64 bytes each, naming
 * their end in the immediate); our chains stay outstanding. Once it is in error every work request
 * completes, flushed, as a real one's do. */
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int i = 0;

	if (fk.qp.state != IBV_QPS_ERR) {
		for (; i < n && fk.arrived && fk.recvs; i++, fk.arrived--, fk.recvs--) {
			memset(&wc[i], 0, sizeof(wc[i]));
			fk.arrived_pos += 64;
			wc[i].status = IBV_WC_SUCCESS;
			wc[i].opcode = IBV_WC_RECV_RDMA_WITH_IMM;
			wc[i].wc_flags = IBV_WC_WITH_IMM;
			wc[i].imm_data = htonl(MESH_AQ_IMM_POS | (uint32_t)(fk.arrived_pos & MESH_AQ_IMM_MASK));
		}
		return i;
	}
	for (; i < n && (fk.flushed < fk.nwr || fk.recvs); i++) {
		memset(&wc[i], 0, sizeof(wc[i]));
		wc[i].status = IBV_WC_WR_FLUSH_ERR;
		if (fk.flushed < fk.nwr) {
			wc[i].wr_id = fk.wr[fk.flushed++].wr_id;
		} else {
			wc[i].wr_id = 0;
			fk.recvs--;
		}
	}
	return i;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return 0;
}

struct ibv_device **ibv_get_device_list(int *num)
{
	fk.list[0] = &fk.dev;
	fk.list[1] = NULL;
	return fk.list;
}

void ibv_free_device_list(struct ibv_device **list)
{
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return "fake0";
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	fk.ctx.ops.post_send = fake_post_send;
	fk.ctx.ops.post_recv = fake_post_recv;
	fk.ctx.ops.poll_cq = fake_poll_cq;
	fk.ctx.ops.req_notify_cq = fake_req_notify_cq;
	return &fk.ctx;
}

int ibv_close_device(struct ibv_context *context)
{
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	fk.pd.context = context;
	return &fk.pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	fk.cch.context = context;
	fk.cch.fd = eventfd(0, EFD_CLOEXEC);
	return fk.cch.fd < 0 ? NULL : &fk.cch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	close(channel->fd);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel,
			     int comp_vector)
{
	fk.cq.context = context;
	return &fk.cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	errno = EAGAIN;
	return -1;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
}

/* verbs.h makes ibv_reg_mr a macro over these two */
struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct ibv_mr *mr = &fk.mr[fk.mrs++];

	mr->addr = addr;
	mr->length = length;
	mr->lkey = mr->rkey = (uint32_t)fk.mrs;
	return mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return (ibv_reg_mr)(pd, addr, length, (int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	fk.qp.context = pd->context;
	fk.qp.qp_num = 0x1234;
	return &fk.qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	qp->state = attr->qp_state;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	return 0;
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	return "fake status";
}

/* ---- a channel as chan_create leaves it, its AQ area offered by meshd ---- */

#define RING (1u << 20)

struct aq_fixture {
	mesh_channel_t c;
	void *mem;
};

static void aq_fixture_open(struct aq_fixture *f)
{
	struct mesh_ring_aq *a;

	memset(&fk, 0, sizeof(fk));
	memset(f, 0, sizeof(*f));
	f->mem = aligned_alloc(4096, MESH_RING_CTRL_SIZE + 2 * RING);
	assert_non_null(f->mem);
	memset(f->mem, 0, MESH_RING_CTRL_SIZE + 2 * RING);
	f->c.ctrl = f->mem;
	f->c.tx = (uint8_t *)f->mem + MESH_RING_CTRL_SIZE;
	f->c.rx = f->c.tx + RING;
	f->c.size = RING;
	f->c.kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	f->c.wake = f->c.lifeline = f->c.epfd = -1;
	assert_true(f->c.kick >= 0);
	fk.page = f->c.ctrl;
	a = mesh_ring_aq(f->c.ctrl);
	a->path_valid = 1;
	a->port = 1;
	a->path_mtu = IBV_MTU_1024;
	strcpy(a->dev, "fake0");
	aq_open(&f->c);
	assert_non_null(f->c.aq);
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_OFFER);
	/* the peer's QP, as meshd relays it: its RX area at 0x100000000 */
	a->peer_qpn = 0x42;
	a->peer_psn = 7;
	a->peer_rx_addr = 0x100000000ull;
	a->peer_rx_rkey = 9;
	a->peer_dir_addr = 0x200000000ull;
	a->peer_dir_rkey = 10;
	a->peer_caps = MESH_AQ_CAP_IMM_POS;
	atomic_store(&a->peer_state, MESH_AQ_PEER_INFO);
	aq_progress(&f->c);
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_READY);
	assert_int_equal(fk.qp.state, IBV_QPS_RTS);
}

static void aq_fixture_close(struct aq_fixture *f)
{
	aq_close(&f->c);
	close(f->c.kick);
	free(f->mem);
}

/* What tx_publish does for len bytes written while meshd still posts them. */
static void aq_app_writes_unowned(struct aq_fixture *f, uint64_t len)
{
	f->c.tx_prod += len;
	aq_progress(&f->c);
	assert_false(aq_owned(&f->c));
	tx_show(&f->c, f->c.tx_prod);
}

static void aq_meshd_grants(struct aq_fixture *f, uint64_t from)
{
	struct mesh_ring_aq *a = mesh_ring_aq(f->c.ctrl);

	atomic_store(&a->grant_pos, from);
	atomic_store(&a->grant, MESH_AQ_APP);
}

/* Every write of [from, to) posted once, in order, the first of 16 KiB (nothing was in flight), the
 * others of at most 64 KiB, each naming its end in its immediate, and the page's tx_prod covering
 * each when it went and never moving back from shown, what it was before. */
static void aq_check_posted(uint64_t from, uint64_t to, uint64_t shown)
{
	uint64_t pos = from;

	for (int i = 0; i < fk.nwr; i++) {
		struct fake_wr *w = &fk.wr[i];

		assert_int_equal(w->opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
		assert_int_equal(w->off, pos & (RING - 1));
		if (i == 0)
			assert_int_equal(w->len, to - from < 16384 ? to - from : 16384);
		assert_true(w->len > 0 && w->len <= 65536);
		pos += w->len;
		assert_int_equal(w->imm, MESH_AQ_IMM_POS | (pos & MESH_AQ_IMM_MASK));
		assert_true(w->shown >= pos);
		assert_true(w->shown >= shown);
		shown = w->shown;
	}
	assert_int_equal(pos, to);
}

/* meshd granted from 0 while the application, not yet seeing it, published a whole ring: the
 * chains that then cover those bytes must not publish their smaller ends (meshd broke such a
 * channel in the VM's all-to-all test: "tx_prod 262144 outside [1048576, 1048576]"). */
static void aq_flush__grant_after_unowned_publish__tx_prod_never_moves_back(void **state)
{
	struct aq_fixture f;

	aq_fixture_open(&f);
	aq_meshd_grants(&f, 0); /* meshd read tx_prod 0 and granted ... */
	f.c.tx_prod += RING;    /* ... as the application wrote a ring's worth */
	tx_show(&f.c, f.c.tx_prod);
	assert_int_equal(atomic_load(&f.c.ctrl->tx_prod), RING);
	aq_progress(&f.c); /* takes the grant from 0 and posts */
	assert_true(aq_owned(&f.c));
	assert_int_equal(atomic_load(&mesh_ring_aq(f.c.ctrl)->grant), MESH_AQ_TAKEN);
	assert_int_equal(fk.nwr, 1 + (RING - 16384 + 65535) / 65536);
	aq_check_posted(0, RING, RING);
	assert_int_equal(atomic_load(&f.c.ctrl->tx_prod), RING);
	aq_fixture_close(&f);
}

static uint64_t aq_kicks(struct aq_fixture *f)
{
	uint64_t n = 0;

	return read(f->c.kick, &n, sizeof(n)) == sizeof(n) ? n : 0;
}

/* A grant is ours once we turned it to TAKEN (ring.h MESH_AQ_CAP_TAKE), and we say so to meshd; one
 * that meshd withdrew before we looked (it saw bytes we published past it) is not taken, and
 * nothing of ours is posted: meshd posts them. Its next grant is taken from its own position. */
static void aq_grant__withdrawn_before_taken__not_ours_then_the_next_one_is(void **state)
{
	struct aq_fixture f;
	struct mesh_ring_aq *a;

	aq_fixture_open(&f);
	a = mesh_ring_aq(f.c.ctrl);
	assert_true(a->caps & MESH_AQ_CAP_TAKE);
	aq_meshd_grants(&f, 0);
	atomic_store(&a->grant, MESH_AQ_MESHD); /* withdrawn: we had published without seeing it */
	(void)aq_kicks(&f);
	aq_app_writes_unowned(&f, 100);
	assert_int_equal(fk.nwr, 0);
	assert_int_equal(atomic_load(&a->grant), MESH_AQ_MESHD);
	aq_meshd_grants(&f, 100); /* meshd posted them, and grants again */
	aq_progress(&f.c);
	assert_true(aq_owned(&f.c));
	assert_int_equal(atomic_load(&a->grant), MESH_AQ_TAKEN);
	assert_true(aq_kicks(&f) >= 1); /* meshd tells the peer's now */
	assert_int_equal(fk.nwr, 0);
	f.c.tx_prod += 50;
	aq_progress(&f.c);
	aq_check_posted(100, 150, 100);
	/* A revocation replaces TAKEN as it replaced APP. */
	atomic_store(&a->grant, MESH_AQ_REVOKED);
	aq_progress(&f.c);
	assert_false(aq_owned(&f.c));
	aq_fixture_close(&f);
}

/* Granted first, then written: each chain's end is published before the chain is posted (the
 * peer may credit what arrives before ibv_post_send returns). */
static void aq_flush__owned_then_written__each_chain_published_before_its_post(void **state)
{
	struct aq_fixture f;

	aq_fixture_open(&f);
	aq_app_writes_unowned(&f, 100);
	aq_meshd_grants(&f, 100);
	aq_progress(&f.c);
	assert_true(aq_owned(&f.c));
	assert_int_equal(fk.nwr, 0);
	f.c.tx_prod += RING - 100; /* tx_publish's owned path */
	aq_progress(&f.c);
	aq_check_posted(100, RING, 100);
	assert_int_equal(fk.wr[0].len, 16384);
	assert_int_equal(fk.wr[1].len, 65536);
	assert_int_equal(fk.wr[15].shown, 100 + 16384 + 15 * 65536); /* the first chain's end, not more */
	assert_int_equal(atomic_load(&f.c.ctrl->tx_prod), RING);
	aq_fixture_close(&f);
}

/* A post that fails stops the QP; once its first chain is flushed the half goes back to meshd
 * with everything written published, for meshd to write from what the peer has. */
static void aq_flush__post_fails__half_given_back_with_all_published(void **state)
{
	struct aq_fixture f;
	struct mesh_ring_aq *a;

	aq_fixture_open(&f);
	a = mesh_ring_aq(f.c.ctrl);
	aq_meshd_grants(&f, 0);
	aq_progress(&f.c);
	assert_true(aq_owned(&f.c));
	fk.fail_post_at = 2;
	f.c.tx_prod += RING;
	aq_progress(&f.c);
	assert_false(aq_owned(&f.c));
	assert_int_equal(fk.nwr, 16); /* the first chain went */
	aq_check_posted(0, 16384 + 15 * 65536, 0);
	assert_int_equal(fk.qp.state, IBV_QPS_ERR); /* nothing of it may land after meshd writes */
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_READY); /* IDLE only once the chain is in */
	assert_int_equal(atomic_load(&f.c.ctrl->tx_prod), RING); /* the second chain's end, published before its post */
	aq_progress(&f.c); /* polls the flushed chain */
	assert_int_equal(fk.flushed, 16);
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_IDLE);
	assert_int_equal(atomic_load(&f.c.ctrl->tx_prod), RING);
	aq_fixture_close(&f);
}

/* Messages of up to 256 bytes go inline, as perftest sends its own: the device need not read them
 * from the ring. Bigger ones do not. */
static void aq_flush__small_write__inline_bigger_not(void **state)
{
	struct aq_fixture f;

	aq_fixture_open(&f);
	aq_meshd_grants(&f, 0);
	aq_progress(&f.c);
	assert_true(aq_owned(&f.c));
	f.c.tx_prod += 64;
	aq_progress(&f.c);
	f.c.tx_prod += 256;
	aq_progress(&f.c);
	f.c.tx_prod += 257;
	aq_progress(&f.c);
	assert_int_equal(fk.nwr, 3);
	assert_int_equal(fk.wr[0].len, 64);
	assert_int_equal(fk.wr[1].len, 256);
	assert_int_equal(fk.wr[2].len, 257);
	assert_int_equal(fk.wr[2].off, 64 + 256);
	assert_int_equal(fk.wr[2].imm, MESH_AQ_IMM_POS | (64 + 256 + 257));
	assert_true(fk.wr[0].inlined && fk.wr[0].signalled);
	assert_true(fk.wr[1].inlined && fk.wr[1].signalled);
	assert_true(!fk.wr[2].inlined && fk.wr[2].signalled);
	aq_fixture_close(&f);
}

/* The peer's immediates each use one of our receives: they are posted again 16 at once, in one
 * call, not one call per message; and every immediate's position is taken. */
static void aq_poll__receives_used__posted_again_sixteen_at_once(void **state)
{
	struct aq_fixture f;

	aq_fixture_open(&f);
	assert_int_equal(fk.recvs, 128); /* connected: the whole queue */
	assert_int_equal(fk.recv_calls, 8);
	fk.arrived = 15;
	aq_progress(&f.c);
	assert_int_equal(fk.arrived, 0);
	assert_int_equal(fk.recvs, 128 - 15); /* plenty left: none posted */
	assert_int_equal(fk.recv_calls, 8);
	assert_int_equal(aq_rx_seen(&f.c), 15 * 64);
	assert_int_equal(atomic_load(&mesh_ring_aq(f.c.ctrl)->rx_seen), 15 * 64);
	fk.arrived = 1;
	aq_progress(&f.c);
	assert_int_equal(fk.recvs, 128); /* the 16th: 16 posted again */
	assert_int_equal(fk.recv_calls, 9);
	assert_int_equal(aq_rx_seen(&f.c), 16 * 64);
	fk.arrived = 100; /* a burst: every receive it took is back after the poll */
	aq_progress(&f.c);
	assert_int_equal(fk.arrived, 0);
	assert_int_equal(fk.recvs, 128);
	assert_int_equal(aq_rx_seen(&f.c), 116 * 64);
	aq_fixture_close(&f);
}

/* ---- over the tcp provider (aq_tcp.c): real sockets on the loopback ---- */

#define TRING (64u << 10)

/* Two applications' channels, a and b, whose meshd offer the tcp path on 127.0.0.1; the test relays
 * their ports and tokens as meshd would. */
struct aqt_fixture {
	mesh_channel_t c[2];
	void *mem[2];
};

static void aqt_chan_open(mesh_channel_t *c, void **mem)
{
	struct mesh_ring_aq *a;
	uint32_t lo = htonl(INADDR_LOOPBACK);

	memset(c, 0, sizeof(*c));
	*mem = aligned_alloc(4096, MESH_RING_CTRL_SIZE + 2 * TRING);
	assert_non_null(*mem);
	memset(*mem, 0, MESH_RING_CTRL_SIZE + 2 * TRING);
	c->ctrl = *mem;
	c->tx = (uint8_t *)*mem + MESH_RING_CTRL_SIZE;
	c->rx = c->tx + TRING;
	c->size = TRING;
	c->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->wake = c->lifeline = c->epfd = -1;
	assert_true(c->kick >= 0);
	a = mesh_ring_aq(c->ctrl);
	a->path_valid = MESH_AQ_PATH_TCP;
	a->tcp_family = AF_INET;
	memcpy(a->tcp_local, &lo, 4);
	memcpy(a->tcp_peer, &lo, 4);
	aq_open(c);
	assert_non_null(c->aq);
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_OFFER);
	assert_true(a->tcp_port > 0 && a->tcp_port < 65536);
}

/* What meshd relays: one application's port and token into the other's page. */
static void aqt_relay(mesh_channel_t *from, mesh_channel_t *to)
{
	struct mesh_ring_aq *f = mesh_ring_aq(from->ctrl), *t = mesh_ring_aq(to->ctrl);

	t->peer_tcp_port = f->tcp_port;
	memcpy(t->peer_tcp_token, f->tcp_token, sizeof(t->peer_tcp_token));
	atomic_store(&t->peer_state, MESH_AQ_PEER_INFO);
}

static void aqt_grant(mesh_channel_t *c, uint64_t from)
{
	struct mesh_ring_aq *a = mesh_ring_aq(c->ctrl);

	atomic_store(&a->grant_pos, from);
	atomic_store(&a->grant, MESH_AQ_APP);
}

static uint32_t aqt_state(mesh_channel_t *c)
{
	return atomic_load(&mesh_ring_aq(c->ctrl)->app_state);
}

/* Both progress until cond holds (or a second passes). */
static bool aqt_run(struct aqt_fixture *f, bool (*cond)(struct aqt_fixture *f))
{
	for (int i = 0; i < 1000; i++) {
		aq_progress(&f->c[0]);
		aq_progress(&f->c[1]);
		if (cond(f))
			return true;
		usleep(1000);
	}
	return false;
}

static bool aqt_both_ready(struct aqt_fixture *f)
{
	return aqt_state(&f->c[0]) == MESH_AQ_READY && aqt_state(&f->c[1]) == MESH_AQ_READY;
}

static void aqt_fixture_open(struct aqt_fixture *f)
{
	memset(&fk, 0, sizeof(fk));
	aqt_chan_open(&f->c[0], &f->mem[0]);
	aqt_chan_open(&f->c[1], &f->mem[1]);
	aqt_relay(&f->c[0], &f->c[1]);
	aqt_relay(&f->c[1], &f->c[0]);
	assert_true(aqt_run(f, aqt_both_ready));
	assert_true(aq_connected(&f->c[0]) && aq_connected(&f->c[1]));
}

static void aqt_fixture_close(struct aqt_fixture *f)
{
	for (int i = 0; i < 2; i++) {
		aq_close(&f->c[i]);
		close(f->c[i].kick);
		free(f->mem[i]);
	}
}

/* TCP sockets of this process that are established (/proc/self/fd matched in /proc/net/tcp). */
static int aqt_established(void)
{
	char path[64], link[64], line[512];
	unsigned long inodes[256];
	int n = 0, found = 0;
	FILE *f;

	for (int fd = 0; fd < 1024 && n < 256; fd++) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			if (!strncmp(link, "socket:[", 8))
				inodes[n++] = strtoul(link + 8, NULL, 10);
		}
	}
	f = fopen("/proc/net/tcp", "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned st;
		unsigned long ino;

		if (sscanf(line, "%*d: %*x:%*x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &st, &ino) != 2 || st != 1)
			continue;
		for (int i = 0; i < n; i++)
			found += inodes[i] == ino;
	}
	fclose(f);
	return found;
}

/* The application writes len bytes of the pattern at its tx_prod (as mesh_send does) and publishes. */
static void aqt_write(mesh_channel_t *c, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++) {
		uint64_t pos = c->tx_prod + i;

		c->tx[pos & (c->size - 1)] = (uint8_t)(pos * 7 + 3);
	}
	c->tx_prod += len;
	aq_progress(c);
	if (!aq_owned(c))
		tx_show(c, c->tx_prod);
}

static uint64_t aqt_want;
static bool aqt_b_seen(struct aqt_fixture *f)
{
	return aq_rx_seen(&f->c[1]) >= aqt_want;
}

/* The reader's RX area holds the pattern at every offset of [from, to). */
static void aqt_check_rx(mesh_channel_t *c, uint64_t from, uint64_t to)
{
	for (uint64_t pos = from; pos < to; pos++)
		if (c->rx[pos & (c->size - 1)] != (uint8_t)(pos * 7 + 3))
			fail_msg("byte %llu is %u, not %u", (unsigned long long)pos, c->rx[pos & (c->size - 1)],
				 (uint8_t)(pos * 7 + 3));
}

/* Both applications share one connection. Granted from where meshd left off, a's bytes go on it
 * straight into b's RX area
 * at their offsets, across the ring's end; b publishes each arrival in rx_seen, never past its
 * reader's window (it stops reading, and goes on once its reader made room). */
static void aq_tcp__granted__bytes_land_at_their_offsets_within_the_window(void **state)
{
	struct aqt_fixture f;
	mesh_channel_t *a = &f.c[0], *b = &f.c[1];

	aqt_fixture_open(&f);
	/* One connection for both halves (its two ends here), as a TCP program's: a connection per
	 * direction cost a pure ACK segment per message. */
	assert_int_equal(aqt_established(), 2);
	/* meshd sent the first 1000 bytes itself; b's reader took 900 of them */
	a->tx_prod = 1000;
	tx_show(a, 1000);
	a->tx_cons = 900;
	b->rx_cons = 900;
	aqt_grant(a, 1000);
	aq_progress(a);
	assert_true(aq_owned(a));
	aqt_write(a, TRING - 100); /* fills b's window exactly: [900, 900 + TRING) */
	assert_int_equal(atomic_load(&a->ctrl->tx_prod), 1000 + TRING - 100);
	aqt_want = 900 + TRING;
	assert_true(aqt_run(&f, aqt_b_seen));
	assert_int_equal(aq_rx_seen(b), 900 + TRING);
	aqt_check_rx(b, 1000, 900 + TRING);
	assert_int_equal(atomic_load(&mesh_ring_aq(b->ctrl)->rx_seen), 900 + TRING);
	/* more than b's window: b reads none of it until its reader makes room */
	a->tx_cons = 900 + TRING - 4096; /* (meshd's credits: a may reuse that much) */
	aqt_write(a, 4096);
	for (int i = 0; i < 50; i++) {
		aq_progress(a);
		aq_progress(b);
		usleep(1000);
	}
	assert_int_equal(aq_rx_seen(b), 900 + TRING);
	b->rx_cons += 4096;
	aqt_want = 900 + TRING + 4096;
	assert_true(aqt_run(&f, aqt_b_seen));
	aqt_check_rx(b, 900 + 4096, 900 + TRING + 4096);
	aqt_fixture_close(&f);
}

/* Strangers on b's port: one that says a wrong token is closed, six that say nothing (more than b's
 * slots) are pushed out in turn, the real peer gets in all the same, and nothing of theirs reaches
 * b's ring. */
static void aq_tcp__strangers_on_the_port__closed_and_the_peer_gets_in(void **state)
{
	struct aqt_fixture f;
	mesh_channel_t *a = &f.c[0], *b = &f.c[1];
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint8_t hello[4 + MESH_AQ_TOKEN_LEN], junk[256];
	uint32_t magic = htonl(MESH_AQ_TCP_MAGIC);
	int s[7], i;
	ssize_t r;
	char c;

	memset(&fk, 0, sizeof(fk));
	aqt_chan_open(a, &f.mem[0]);
	aqt_chan_open(b, &f.mem[1]);
	sin.sin_port = htons((uint16_t)mesh_ring_aq(b->ctrl)->tcp_port);
	memcpy(hello, &magic, 4);
	memcpy(hello + 4, mesh_ring_aq(b->ctrl)->tcp_token, MESH_AQ_TOKEN_LEN);
	hello[4] ^= 1; /* one bit off */
	memset(junk, 0x55, sizeof(junk));
	for (i = 0; i < 7; i++) {
		s[i] = socket(AF_INET, SOCK_STREAM, 0);
		assert_true(s[i] >= 0);
		assert_int_equal(connect(s[i], (struct sockaddr *)&sin, sizeof(sin)), 0);
		if (!i) {
			assert_int_equal(send(s[0], hello, sizeof(hello), 0), sizeof(hello));
			assert_int_equal(send(s[0], junk, sizeof(junk), MSG_NOSIGNAL), sizeof(junk));
		}
		aq_progress(b); /* the flood comes over time: b takes each (the kernel's queue is short) */
	}
	/* s[1..6] say nothing */
	for (i = 0; i < 20; i++) {
		aq_progress(b);
		usleep(1000);
	}
	r = recv(s[0], &c, 1, MSG_DONTWAIT); /* closed by b: an end, or a reset for the junk it left unread */
	assert_true(r == 0 || (r < 0 && errno == ECONNRESET));
	aqt_relay(a, b);
	aqt_relay(b, a);
	assert_true(aqt_run(&f, aqt_both_ready));
	a->tx_prod = 0;
	aqt_grant(a, 0);
	aq_progress(a);
	aqt_write(a, 100);
	aqt_want = 100;
	assert_true(aqt_run(&f, aqt_b_seen));
	aqt_check_rx(b, 0, 100);
	assert_int_equal(aq_rx_seen(b), 100);
	for (i = 0; i < 7; i++)
		close(s[i]);
	aqt_fixture_close(&f);
}

/* A revocation (its link or rail went): a stops sending on its connection, says IDLE, and whatever
 * it published is meshd's to send; what arrives on the dead connection after b's reader went past
 * it is dropped, not written over what the reader has. */
static void aq_tcp__revoked__idle_and_nothing_more_sent(void **state)
{
	struct aqt_fixture f;
	mesh_channel_t *a = &f.c[0], *b = &f.c[1];
	struct mesh_ring_aq *qa;

	aqt_fixture_open(&f);
	qa = mesh_ring_aq(a->ctrl);
	aqt_grant(a, 0);
	aq_progress(a);
	aqt_write(a, 200);
	aqt_want = 200;
	assert_true(aqt_run(&f, aqt_b_seen));
	atomic_store(&qa->grant, MESH_AQ_REVOKED);
	aq_progress(a);
	assert_int_equal(aqt_state(a), MESH_AQ_IDLE);
	assert_false(aq_owned(a));
	a->tx_prod += 50; /* written after: meshd's */
	aq_progress(a);
	assert_int_equal(atomic_load(&qa->rx_seen), 0);
	for (int i = 0; i < 20; i++) {
		aq_progress(b);
		usleep(1000);
	}
	assert_int_equal(aq_rx_seen(b), 200); /* nothing more came */
	aqt_fixture_close(&f);
}

/* meshd's page names a port or token that cannot be the peer's: no connection is tried, and the
 * half is given back at once (IDLE) for meshd to send. */
static void aq_tcp__peer_port_zero__idle_without_connecting(void **state)
{
	struct aqt_fixture f;
	struct mesh_ring_aq *qa;

	memset(&fk, 0, sizeof(fk));
	aqt_chan_open(&f.c[0], &f.mem[0]);
	aqt_chan_open(&f.c[1], &f.mem[1]);
	aqt_relay(&f.c[1], &f.c[0]);
	qa = mesh_ring_aq(f.c[0].ctrl);
	qa->peer_tcp_port = 0;
	aq_progress(&f.c[0]);
	assert_int_equal(aqt_state(&f.c[0]), MESH_AQ_IDLE);
	assert_false(aq_connected(&f.c[0]));
	aqt_relay(&f.c[1], &f.c[0]);
	memset(mesh_ring_aq(f.c[1].ctrl)->peer_tcp_token, 0, MESH_AQ_TOKEN_LEN);
	mesh_ring_aq(f.c[1].ctrl)->peer_tcp_port = 1;
	atomic_store(&mesh_ring_aq(f.c[1].ctrl)->peer_state, MESH_AQ_PEER_INFO);
	aq_progress(&f.c[1]);
	assert_int_equal(aqt_state(&f.c[1]), MESH_AQ_IDLE);
	aqt_fixture_close(&f);
}

/* A program near its RLIMIT_NOFILE keeps its descriptors for itself: the offer is declined (meshd
 * sends), with nothing of it left open. */
static void aq_tcp__descriptors_short__offer_declined(void **state)
{
	struct rlimit old, rl;
	mesh_channel_t c;
	struct mesh_ring_aq *a;
	uint32_t lo = htonl(INADDR_LOOPBACK);
	void *mem;
	int probe;

	memset(&c, 0, sizeof(c));
	mem = aligned_alloc(4096, MESH_RING_CTRL_SIZE + 2 * TRING);
	assert_non_null(mem);
	memset(mem, 0, MESH_RING_CTRL_SIZE + 2 * TRING);
	c.ctrl = mem;
	c.tx = (uint8_t *)mem + MESH_RING_CTRL_SIZE;
	c.rx = c.tx + TRING;
	c.size = TRING;
	c.kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c.wake = c.lifeline = c.epfd = -1;
	a = mesh_ring_aq(c.ctrl);
	a->path_valid = MESH_AQ_PATH_TCP;
	a->tcp_family = AF_INET;
	memcpy(a->tcp_local, &lo, 4);
	memcpy(a->tcp_peer, &lo, 4);
	probe = dup(0); /* the lowest free descriptor */
	assert_true(probe >= 0);
	close(probe);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	rl = old;
	rl.rlim_cur = (rlim_t)probe + 2; /* room for ours, but past three quarters */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	aq_open(&c);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	assert_null(c.aq);
	assert_int_equal(atomic_load(&a->app_state), MESH_AQ_NONE);
	assert_int_equal(dup(0), probe); /* nothing left open */
	close(probe);
	close(c.kick);
	free(mem);
}

static const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test(f)
	T(aq_flush__grant_after_unowned_publish__tx_prod_never_moves_back),
	T(aq_flush__owned_then_written__each_chain_published_before_its_post),
	T(aq_grant__withdrawn_before_taken__not_ours_then_the_next_one_is),
	T(aq_flush__post_fails__half_given_back_with_all_published),
	T(aq_flush__small_write__inline_bigger_not),
	T(aq_poll__receives_used__posted_again_sixteen_at_once),
	T(aq_tcp__granted__bytes_land_at_their_offsets_within_the_window),
	T(aq_tcp__strangers_on_the_port__closed_and_the_peer_gets_in),
	T(aq_tcp__revoked__idle_and_nothing_more_sent),
	T(aq_tcp__peer_port_zero__idle_without_connecting),
	T(aq_tcp__descriptors_short__offer_declined),
};

UNIT_MAIN("aq", tests, NULL, NULL)
