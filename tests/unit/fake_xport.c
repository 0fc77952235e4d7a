#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "fake_xport.h"

static struct fake_xport *fake_of(xport_t *x)
{
	assert_ptr_equal(x->ops, &fake_xport_ops);
	return (struct fake_xport *)x;
}

static struct fake_conn *fake_conn_of(xport_conn_t *c)
{
	assert_non_null(c);
	assert_ptr_equal(c->xport->ops, &fake_xport_ops);
	return (struct fake_conn *)c;
}

static int take_failure(struct fake_fail *f)
{
	int ret = f->err;

	if (!ret)
		return 0;
	if (f->skip) {
		f->skip--;
		return 0;
	}
	f->err = 0;
	return ret;
}

static void copy_str(char *dst, const char *src, size_t size)
{
	snprintf(dst, size, "%s", src ? src : "");
}

static struct fake_conn *conn_new(struct fake_xport *fx, const char *peer_addr, bool passive)
{
	struct fake_conn *fc = calloc(1, sizeof(*fc));

	assert_non_null(fc);
	fc->base.xport = &fx->base;
	copy_str(fc->base.peer_addr, peer_addr, sizeof(fc->base.peer_addr));
	fc->fx = fx;
	fc->id = ++fx->next_conn_id;
	fc->passive = passive;
	fc->next = fx->conns;
	if (fx->conns)
		fx->conns->prev = fc;
	fx->conns = fc;
	fx->live_conns++;
	return fc;
}

static void conn_free(struct fake_conn *fc)
{
	struct fake_xport *fx = fc->fx;

	if (fc->prev)
		fc->prev->next = fc->next;
	else
		fx->conns = fc->next;
	if (fc->next)
		fc->next->prev = fc->prev;
	fx->live_conns--;
	/* Poison, so a use after destroy shows under valgrind/ASan rather than passing quietly. */
	memset(fc, 0xa5, sizeof(*fc));
	free(fc);
}

static struct fake_cm_rec *cm_rec(struct fake_cm_rec *arr, size_t *n, struct fake_conn *fc, const void *pdata,
				  size_t len)
{
	struct fake_cm_rec *r;

	assert_true(*n < FAKE_MAX_RECS);
	assert_true(len <= XPORT_PDATA_MAX);
	r = &arr[(*n)++];
	memset(r, 0, sizeof(*r));
	r->conn = fc;
	r->conn_id = fc->id;
	r->index = fc->base.index;
	r->ctx = fc->base.ctx;
	copy_str(r->addr, fc->base.peer_addr, sizeof(r->addr));
	if (len)
		memcpy(r->pdata, pdata, len);
	r->pdata_len = len;
	return r;
}

static struct fake_post *post_rec(xport_conn_t *c, enum xport_op op, xport_mr_t *mr, const void *buf,
				  uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct fake_conn *fc = fake_conn_of(c);
	struct fake_xport *fx = fc->fx;
	struct fake_post *p;

	assert_true(fx->n_posts < FAKE_MAX_POSTS);
	/* Local buffers must lie inside the registration they name, as verbs would check (a
	 * zero-length receive, for immediates only, has no buffer). */
	if (len || op != XPORT_OP_RECV) {
		assert_non_null(mr);
		assert_true((const uint8_t *)buf >= (const uint8_t *)mr->addr);
		assert_true((const uint8_t *)buf + len <= (const uint8_t *)mr->addr + mr->len);
	}
	p = &fx->posts[fx->n_posts++];
	memset(p, 0, sizeof(*p));
	p->op = op;
	p->conn = fc;
	p->conn_id = fc->id;
	p->mr = mr;
	p->buf = (void *)(uintptr_t)buf;
	p->len = len;
	p->raddr = raddr;
	p->rkey = rkey;
	p->wr_id = wr_id;
	return p;
}

static int fake_create(const struct xport_attr *attr, xport_t **out)
{
	struct fake_xport *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -ENOMEM;
	fx->base.ops = &fake_xport_ops;
	if (attr)
		fx->attr = *attr;
	*out = &fx->base;
	return 0;
}

static void fake_destroy(xport_t *x)
{
	struct fake_xport *fx = fake_of(x);

	while (fx->conns)
		conn_free(fx->conns);
	free(fx);
}

static int fake_event_fd(xport_t *x)
{
	(void)fake_of(x);
	return -EOPNOTSUPP; /* nothing to poll on: the tests hand events over directly */
}

static int fake_listen(xport_t *x, const char *addr, uint16_t port)
{
	struct fake_xport *fx = fake_of(x);

	copy_str(fx->listen_addr, addr, sizeof(fx->listen_addr));
	fx->listen_port = port;
	return 0;
}

static int fake_connect(xport_t *x, const char *src_addr, const char *addr, uint16_t port, const void *pdata,
			size_t pdata_len, void *ctx, uint32_t index, xport_conn_t **out)
{
	struct fake_xport *fx = fake_of(x);
	struct fake_conn *fc;
	struct fake_cm_rec *r;
	int ret = take_failure(&fx->fail_connect);

	if (ret)
		return ret;
	if (pdata_len > XPORT_CONNECT_PDATA_MAX) /* as the real providers */
		return -EINVAL;
	fc = conn_new(fx, addr, false);
	fc->base.ctx = ctx;
	fc->base.scope = ctx;
	fc->base.index = index;
	r = cm_rec(fx->connects, &fx->n_connects, fc, pdata, pdata_len);
	copy_str(r->src_addr, src_addr, sizeof(r->src_addr));
	r->port = port;
	*out = &fc->base;
	return 0;
}

static int fake_accept(xport_conn_t *c, const void *pdata, size_t pdata_len)
{
	struct fake_conn *fc = fake_conn_of(c);
	int ret = take_failure(&fc->fx->fail_accept);

	if (ret)
		return ret;
	assert_true(fc->passive);
	assert_false(fc->accepted);
	assert_false(fc->rejected);
	if (pdata_len > XPORT_PDATA_MAX)
		return -EINVAL;
	fc->accepted = true;
	cm_rec(fc->fx->accepts, &fc->fx->n_accepts, fc, pdata, pdata_len);
	return 0;
}

static int fake_reject(xport_conn_t *c, const void *pdata, size_t pdata_len)
{
	struct fake_conn *fc = fake_conn_of(c);

	assert_true(fc->passive);
	assert_false(fc->accepted);
	assert_false(fc->rejected);
	if (pdata_len > XPORT_CONNECT_PDATA_MAX)
		return -EINVAL;
	fc->rejected = true;
	cm_rec(fc->fx->rejects, &fc->fx->n_rejects, fc, pdata, pdata_len);
	return 0;
}

static int fake_disconnect(xport_conn_t *c)
{
	struct fake_conn *fc = fake_conn_of(c);
	struct fake_xport *fx = fc->fx;

	assert_true(fx->n_disconnects < FAKE_MAX_RECS);
	fx->disconnects[fx->n_disconnects++] = fc->id;
	fc->disconnects++;
	return 0;
}

static void fake_conn_destroy(xport_conn_t *c)
{
	conn_free(fake_conn_of(c));
}

static int fake_mr_reg(xport_conn_t *c, void *addr, size_t len, unsigned access, xport_mr_t **out)
{
	struct fake_conn *fc = fake_conn_of(c);
	struct fake_xport *fx = fc->fx;
	struct fake_mr *mr;
	struct fake_reg *r;
	int ret = take_failure(&fx->fail_mr_reg);

	if (ret)
		return ret;
	assert_non_null(addr);
	assert_true(len > 0);
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->fx = fx;
	mr->id = ++fx->next_mr_id;
	mr->access = access;
	mr->base.xport = c->xport;
	mr->base.addr = addr;
	mr->base.len = len;
	/* Distinct keys, and lkey != rkey so a mix-up shows. */
	mr->base.lkey = 0x1000u + mr->id;
	mr->base.rkey = 0xbe000000u + mr->id * 0x101u;
	fx->live_mrs++;
	assert_true(fx->n_regs < FAKE_MAX_RECS);
	r = &fx->regs[fx->n_regs++];
	r->addr = addr;
	r->len = len;
	r->access = access;
	r->lkey = mr->base.lkey;
	r->rkey = mr->base.rkey;
	r->conn_id = fc->id;
	r->scope = c->scope;
	*out = &mr->base;
	return 0;
}

static void fake_mr_dereg(xport_mr_t *mr)
{
	struct fake_mr *fm = (struct fake_mr *)mr;

	fm->fx->live_mrs--;
	fm->fx->n_deregs++;
	if (fm->id && fm->id <= fm->fx->n_regs)
		fm->fx->regs[fm->id - 1].gone = true;
	memset(fm, 0xa5, sizeof(*fm));
	free(fm);
}

static int fake_post_send(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t wr_id)
{
	struct fake_post *p;
	int ret = take_failure(&fake_conn_of(c)->fx->fail_post_send);

	if (ret)
		return ret;
	p = post_rec(c, XPORT_OP_SEND, mr, buf, len, 0, 0, wr_id);
	memcpy(p->sent, buf, len < FAKE_SEND_COPY ? len : FAKE_SEND_COPY);
	return 0;
}

static int fake_post_recv(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t wr_id)
{
	int ret = take_failure(&fake_conn_of(c)->fx->fail_post_recv);

	if (ret)
		return ret;
	post_rec(c, XPORT_OP_RECV, mr, buf, len, 0, 0, wr_id);
	return 0;
}

static int fake_post_write(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			   uint32_t rkey, uint64_t wr_id)
{
	int ret = take_failure(&fake_conn_of(c)->fx->fail_post_plain_write);

	if (ret)
		return ret;
	post_rec(c, XPORT_OP_WRITE, mr, buf, len, raddr, rkey, wr_id);
	return 0;
}

static int fake_post_write_imm(xport_conn_t *c, xport_mr_t *mr, const void *buf, uint32_t len, uint64_t raddr,
			       uint32_t rkey, uint32_t imm, uint64_t wr_id)
{
	int ret = take_failure(&fake_conn_of(c)->fx->fail_post_write);

	if (ret)
		return ret;
	post_rec(c, XPORT_OP_WRITE_IMM, mr, buf, len, raddr, rkey, wr_id)->imm = imm;
	return 0;
}

static int fake_post_read(xport_conn_t *c, xport_mr_t *mr, void *buf, uint32_t len, uint64_t raddr,
			  uint32_t rkey, uint64_t wr_id)
{
	post_rec(c, XPORT_OP_READ, mr, buf, len, raddr, rkey, wr_id);
	return 0;
}

static int fake_poll(xport_t *x, struct xport_event *evs, int max)
{
	struct fake_xport *fx = fake_of(x);
	int n = 0;

	while (n < max && fx->q_head != fx->q_tail) {
		evs[n++] = fx->queue[fx->q_head % FAKE_MAX_EVENTS];
		fx->q_head++;
	}
	return n;
}

static int fake_path(xport_conn_t *c, struct xport_path *out)
{
	struct fake_xport *fx = (struct fake_xport *)c->xport;

	if (!fx->path_ok)
		return -EOPNOTSUPP;
	memset(out, 0, sizeof(*out));
	if (fx->path_tcp) {
		static const uint8_t l[4] = {10, 0, 0, 1}, p[4] = {10, 0, 0, 2};

		out->kind = XPORT_PATH_TCP;
		out->family = AF_INET;
		memcpy(out->local, l, 4);
		memcpy(out->peer, p, 4);
		strcpy(out->dev, "tcp");
		return 0;
	}
	strcpy(out->dev, "fake0");
	out->port = 1;
	out->sgid_index = 1;
	out->path_mtu = 3; /* IBV_MTU_1024 */
	out->hop_limit = 64;
	out->ack_timeout = 14;
	memset(out->dgid, 0xab, sizeof(out->dgid));
	return 0;
}

static int fake_probe(const char *addr)
{
	(void)addr;
	return 1;
}

const struct xport_ops fake_xport_ops = {
	.name = "fake",
	.probe = fake_probe,
	.create = fake_create,
	.destroy = fake_destroy,
	.event_fd = fake_event_fd,
	.listen = fake_listen,
	.connect = fake_connect,
	.accept = fake_accept,
	.reject = fake_reject,
	.disconnect = fake_disconnect,
	.conn_destroy = fake_conn_destroy,
	.mr_reg = fake_mr_reg,
	.mr_dereg = fake_mr_dereg,
	.post_send = fake_post_send,
	.post_recv = fake_post_recv,
	.post_write = fake_post_write,
	.post_write_imm = fake_post_write_imm,
	.post_read = fake_post_read,
	.poll = fake_poll,
	.path = fake_path,
};

struct fake_xport *fake_xport_new(void)
{
	struct xport_attr attr = {.connect_timeout_ms = 1000, .max_send_wr = 64, .max_recv_wr = 64};
	xport_t *x = NULL;

	assert_int_equal(xport_create(&fake_xport_ops, &attr, &x), 0);
	return fake_of(x);
}

void fake_xport_free(struct fake_xport *fx)
{
	if (fx)
		xport_destroy(&fx->base);
}

struct fake_conn *fake_conn_incoming(struct fake_xport *fx, const char *peer_addr)
{
	return conn_new(fx, peer_addr, true);
}

void fake_xport_push(struct fake_xport *fx, const struct xport_event *ev)
{
	assert_true(fx->q_tail - fx->q_head < FAKE_MAX_EVENTS);
	fx->queue[fx->q_tail % FAKE_MAX_EVENTS] = *ev;
	fx->q_tail++;
}

struct fake_conn *fake_conn_by_id(struct fake_xport *fx, unsigned id)
{
	for (struct fake_conn *fc = fx->conns; fc; fc = fc->next)
		if (fc->id == id)
			return fc;
	return NULL;
}

struct fake_post *fake_post_find(struct fake_xport *fx, size_t from, enum xport_op op, unsigned conn_id,
				 size_t nth)
{
	for (size_t i = from; i < fx->n_posts; i++) {
		struct fake_post *p = &fx->posts[i];

		if (p->op != op || (conn_id && p->conn_id != conn_id))
			continue;
		if (nth-- == 0)
			return p;
	}
	return NULL;
}

size_t fake_post_count(struct fake_xport *fx, size_t from, enum xport_op op, unsigned conn_id)
{
	size_t n = 0;

	for (size_t i = from; i < fx->n_posts; i++)
		n += fx->posts[i].op == op && (!conn_id || fx->posts[i].conn_id == conn_id);
	return n;
}

const struct fake_reg *fake_reg_find(const struct fake_xport *fx, unsigned access)
{
	for (size_t i = fx->n_regs; i-- > 0;)
		if (fx->regs[i].access == access)
			return &fx->regs[i];
	return NULL;
}

bool fake_disconnected(const struct fake_xport *fx, unsigned conn_id)
{
	for (size_t i = 0; i < fx->n_disconnects; i++)
		if (fx->disconnects[i] == conn_id)
			return true;
	return false;
}
