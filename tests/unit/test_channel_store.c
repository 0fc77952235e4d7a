/*
 * A restart of meshd with its channels kept (node/meshd/channel_store.c): an open channel's four
 * descriptors in the service manager's store (faked here: fstore) under names carrying its record,
 * dropped when it is freed; the next meshd restores it and it resumes where its ring stands; a bad
 * entry fails alone; a peer that restarted with its channels kept is resumed, not refused.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "channel_harness.h"
#include "unit_main.h"

/* The service manager's descriptor store, faked: what meshd keeps, by name, as duplicates. */
#define STORE_MAX 32
static struct {
	char name[STORE_MAX][256];
	int fd[STORE_MAX];
	size_t n;
} fstore;

static int fstore_keep(void *ctx, const char *name, const int *fds, size_t n)
{
	(void)ctx;
	assert_int_equal(n, 1);
	assert_true(fstore.n < STORE_MAX);
	assert_true(strlen(name) <= 255 && !strchr(name, ':')); /* a valid FDNAME */
	snprintf(fstore.name[fstore.n], sizeof(fstore.name[0]), "%s", name);
	fstore.fd[fstore.n] = dup(fds[0]);
	assert_true(fstore.fd[fstore.n] >= 0);
	fstore.n++;
	return 0;
}

static void fstore_drop(void *ctx, const char *name)
{
	(void)ctx;
	for (size_t i = 0; i < fstore.n;) {
		if (strcmp(fstore.name[i], name)) {
			i++;
			continue;
		}
		close(fstore.fd[i]);
		fstore.n--;
		fstore.fd[i] = fstore.fd[fstore.n];
		memcpy(fstore.name[i], fstore.name[fstore.n], sizeof(fstore.name[0]));
	}
}

static size_t fstore_count(const char *prefix)
{
	size_t n = 0;

	for (size_t i = 0; i < fstore.n; i++)
		n += !strncmp(fstore.name[i], prefix, strlen(prefix));
	return n;
}

static void fstore_on(struct ct *c)
{
	memset(&fstore, 0, sizeof(fstore));
	c->t.m.store.keep = fstore_keep;
	c->t.m.store.drop = fstore_drop;
}

static void fstore_close(void)
{
	for (size_t i = 0; i < fstore.n; i++)
		close(fstore.fd[i]);
	fstore.n = 0;
}

/* meshd stops with its channels kept (a handover: its link goes, nothing is written to the rings,
 * the process's exit frees the channels), and the next meshd is given the store plus `extra`
 * entries (names and descriptors it takes over): here the same mesh. Returns what
 * channel_store_restore says. */
static int restart_kept(struct ct *c, const char *const *extra, const int *extra_fds, size_t n_extra)
{
	struct mesh *m = &c->t.m;
	int fds[STORE_MAX + 8];
	char *names[STORE_MAX + 8];
	size_t n = 0;
	int ret;

	m->store.handover = true;
	link_lost(c);
	while (m->chans->channels)
		channel_free(m->chans->channels);
	m->store.handover = false;
	m->store.n_kept = 0;
	for (size_t i = 0; i < fstore.n; i++) {
		names[n] = fstore.name[i];
		fds[n++] = dup(fstore.fd[i]); /* the manager passes copies and keeps its own */
	}
	for (size_t i = 0; i < n_extra; i++) {
		names[n] = (char *)extra[i];
		fds[n++] = extra_fds[i];
	}
	ret = channel_store_restore(m, fds, names, n);
	return ret;
}

/* An open channel keeps its four descriptors in the store under names that carry its record,
 * and takes them out when it is freed. */
static void channel_store__open_channel__kept_with_its_record_dropped_when_freed(void **state)
{
	struct ct *c = *state;
	char want[128];
	struct chan *h;

	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_true(chn(c, h)->kept);
	assert_int_equal(fstore.n, 4);
	snprintf(want, sizeof(want), "mc1.%u.ring.%u.%u.%u.", h->id, PEER, h->slot, PEER_SLOT);
	assert_int_equal(fstore_count(want), 1);
	for (const char *k = "kick\0wake\0life\0"; *k; k += strlen(k) + 1) {
		snprintf(want, sizeof(want), "mc1.%u.%s", h->id, k);
		assert_int_equal(fstore_count(want), 1);
	}
	app_hangup(c, h);
	complete_sends(c);
	peer_close_ack(c, h);
	assert_null(channel_find(&c->t.m, h->id));
	assert_int_equal(fstore.n, 0);
	fstore_close();
	mt_finish(&c->t);
}

/* meshd restarts with the channel kept: its application's lifeline never hangs up, the next meshd
 * restores the channel RESUMING in its slot with its positions read off the ring, and the peer's
 * resume rewrites what it lacks: nothing lost, the application saw a pause. */
static void channel_store_restore__kept_channel__resumes_where_its_ring_stands(void **state)
{
	struct ct *c = *state;
	const char *epoch = "mc1.epoch.555";
	int efd = eventfd(0, EFD_CLOEXEC);
	struct pollfd pl;
	struct channel *ch;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 3000);
	app_kick(c, h);
	assert_int_equal(restart_kept(c, &epoch, &efd, 1), 1);
	pl = (struct pollfd){.fd = h->app->fds[FD_LIFELINE], .events = POLLIN};
	assert_int_equal(poll(&pl, 1, 0), 0); /* its lifeline's other end lived on in the store */
	assert_int_equal(c->t.m.predecessor_epoch, 555);
	assert_int_equal(fstore_count("mc1.epoch.555"), 0);
	assert_int_equal(fstore_count("mc1.epoch."), 1); /* this meshd's own, for the next one */
	ch = chn(c, h);
	assert_true(ch->kept && ch->resuming);
	assert_int_equal(ch->slot, h->slot);
	assert_int_equal(ch->peer_slot, PEER_SLOT);
	assert_int_equal(ch->tx_sent, 3000);
	assert_ptr_equal(link_channel_of(c, h->slot), ch);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 1000, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	assert_true(write_count(c, h, from, false) > 0);
	complete_data(c, h, from);
	check_peer_ring(h, 1000, 3000);
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	app_hangup(c, h);
	fstore_close();
	mt_finish(&c->t);
}

/* The store is the manager's, its names meshd's own, but nothing in it is taken on trust: a name
 * that is no channel's, a record that does not parse or names a node not in the configuration, a
 * ring without its other descriptors, a ring of another size than its record or not sealed at its
 * size: each fails (dropped from the store, its descriptors closed) and the good channel beside
 * them is restored. */
static void channel_store_restore__bad_entries__each_fails_alone_the_good_one_restored(void **state)
{
	struct ct *c = *state;
	const char *names[] = {
		"junk",
		"mc1.77.ring.9.3.3.1.1.0.1.2.0.4096.4242", "mc1.77.kick", "mc1.77.wake", "mc1.77.life",
		"mc1.78.ring.1.4.4.1.1.0.1.2.0.4096",
		"mc1.79.ring.1.5.5.1.1.0.1.2.0.4096.4242",
		"mc1.80.ring.1.6.6.1.1.0.1.2.0.8192.4242", "mc1.80.kick", "mc1.80.wake", "mc1.80.life",
		"mc1.81.life",
		"mc1.82.ring.1.7.7.1.1.0.1.2.0.4096.4242", "mc1.82.kick", "mc1.82.wake", "mc1.82.life",
	};
	int fds[ARRAY_SIZE(names)];
	ino_t ino[ARRAY_SIZE(names)];
	struct chan *h;
	struct stat st;

	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		/* Each a file of its own (memfds: an inode each), so that a descriptor number reused
		 * after it was closed is told from one left open. A ring of 4 KiB where the record of
		 * channel 80 says 8 KiB. */
		fds[i] = memfd_create("entry", MFD_CLOEXEC);
		assert_true(fds[i] >= 0);
		assert_int_equal(ftruncate(fds[i], MESH_RING_CTRL_SIZE + 2 * 4096), 0);
		assert_int_equal(fstat(fds[i], &st), 0);
		ino[i] = st.st_ino;
	}
	ct_init_resume(c, 2);
	fstore_on(c);
	h = open_out(c, RING, 2, PEER_SLOT);
	assert_int_equal(restart_kept(c, names, fds, ARRAY_SIZE(names)), 1);
	assert_true(chn(c, h)->resuming);
	for (uint32_t id = 77; id <= 82; id++)
		assert_null(channel_find(&c->t.m, id));
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (!fstat(fds[i], &st) && st.st_ino == ino[i])
			fail_msg("the descriptor of \"%s\" was left open", names[i]);
	assert_int_equal(fstore.n, 5); /* the good channel's four and this meshd's epoch */
	app_hangup(c, h);
	fstore_close();
	mt_finish(&c->t);
}

/* The peer's meshd restarted with its channels kept (its Hello names ours as its predecessor):
 * our channel resumes with the new incarnation, not MESH_EPEERRESTART. */
static void channel_link_up__peer_restarted_with_channels_kept__resumes(void **state)
{
	struct ct *c = *state;
	struct chan *h;
	size_t from;

	ct_init_resume(c, 2);
	h = open_out(c, RING, 2, PEER_SLOT);
	app_write(h, 2000);
	app_kick(c, h);
	link_lost(c);
	c->t.peer_boot = 9999;
	c->t.peer_pred = 4242; /* the harness's first peer meshd */
	from = c->t.fx->n_posts;
	link_back(c, 5000);
	mesh_peer_msg_free(sent_resume(c, h, from));
	assert_false(ring_state(h) & MESH_STATE_ERROR);
	assert_int_equal(chn(c, h)->peer_boot, 9999);
	complete_sends(c);
	from = c->t.fx->n_posts;
	peer_resume(c, h, 500, 0, 0, false);
	assert_string_equal(channel_state_name(chn(c, h)), "OPEN");
	complete_data(c, h, from);
	check_peer_ring(h, 500, 2000);
	app_hangup(c, h);
	mt_finish(&c->t);
}

static const struct CMUnitTest tests[] = {
	T(channel_store__open_channel__kept_with_its_record_dropped_when_freed),
	T(channel_store_restore__kept_channel__resumes_where_its_ring_stands),
	T(channel_store_restore__bad_entries__each_fails_alone_the_good_one_restored),
	T(channel_link_up__peer_restarted_with_channels_kept__resumes),
};

UNIT_MAIN("channel_store", tests, ct_group_setup, NULL)
