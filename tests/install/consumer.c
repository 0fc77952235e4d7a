/*
 * An application outside the project, built against an installed libmesh (pkg-config's mesh.pc or
 * the CMake package rdmamesh::mesh) by tests/install/consumers.sh:
 *
 *   consumer SOCKET NODE PORT BYTES
 *
 * opens a channel through the meshd at SOCKET to an echo server (meshecho) on NODE:PORT, streams
 * BYTES of a pattern while reading the echo back (non-blocking both ways, so neither ring can fill
 * up against the other), shuts its side and checks every byte and the EOF. Exit 0 only then.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 131 + (i >> 12));
}

int main(int argc, char **argv)
{
	mesh_session_t *s = NULL;
	mesh_channel_t *c = NULL;
	unsigned char buf[16384];
	size_t total, sent = 0, got = 0;
	unsigned long node, port;
	int ret, status = 1;
	int shut = 0, eof = 0;

	if (argc != 5) {
		fprintf(stderr, "usage: consumer SOCKET NODE PORT BYTES\n");
		return 2;
	}
	node = strtoul(argv[2], NULL, 10);
	port = strtoul(argv[3], NULL, 10);
	total = strtoul(argv[4], NULL, 10);
	if (!node || !port || port > 65535 || !total) {
		fprintf(stderr, "consumer: NODE, PORT and BYTES must be positive numbers (PORT <= 65535)\n");
		return 2;
	}
	printf("consumer: libmesh %d.%d, mesh.h's MESH_EAUTH reads \"%s\"\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR,
	       mesh_strerror(-MESH_EAUTH));
	ret = mesh_open(argv[1], &s);
	if (ret) {
		fprintf(stderr, "consumer: mesh_open %s: %s\n", argv[1], mesh_strerror(ret));
		return 1;
	}
	ret = mesh_connect(s, (uint32_t)node, (uint16_t)port, NULL, &c);
	if (ret) {
		fprintf(stderr, "consumer: mesh_connect node %lu port %lu: %s %s\n", node, port, mesh_strerror(ret),
			mesh_session_error(s));
		goto out_session;
	}
	while (!eof) {
		int moved = 0;
		ssize_t n;

		if (sent < total) {
			size_t len = total - sent < sizeof(buf) ? total - sent : sizeof(buf);

			for (size_t i = 0; i < len; i++)
				buf[i] = pattern(sent + i);
			n = mesh_send(c, buf, len, MESH_NONBLOCK);
			if (n > 0) {
				sent += (size_t)n;
				moved = 1;
			} else if (n != -EAGAIN) {
				fprintf(stderr, "consumer: mesh_send after %zu bytes: %s\n", sent, mesh_strerror((int)n));
				goto out_channel;
			}
		} else if (!shut) {
			ret = mesh_shutdown(c);
			if (ret) {
				fprintf(stderr, "consumer: mesh_shutdown: %s\n", mesh_strerror(ret));
				goto out_channel;
			}
			shut = 1;
		}
		n = mesh_recv(c, buf, sizeof(buf), MESH_NONBLOCK);
		if (n > 0) {
			for (ssize_t i = 0; i < n; i++) {
				if (buf[i] != pattern(got + (size_t)i)) {
					fprintf(stderr, "consumer: byte %zu of the echo differs\n", got + (size_t)i);
					goto out_channel;
				}
			}
			got += (size_t)n;
			moved = 1;
		} else if (n == 0) {
			eof = 1;
		} else if (n != -EAGAIN) {
			fprintf(stderr, "consumer: mesh_recv after %zu bytes: %s\n", got, mesh_strerror((int)n));
			goto out_channel;
		}
		if (!moved && !eof) {
			struct pollfd p = {.fd = mesh_channel_fd(c), .events = POLLIN};

			if (poll(&p, 1, 10000) == 0) {
				fprintf(stderr, "consumer: nothing moved for 10 s (sent %zu, echoed %zu)\n", sent, got);
				goto out_channel;
			}
		}
	}
	if (got != total) {
		fprintf(stderr, "consumer: EOF after %zu of %zu echoed bytes\n", got, total);
		goto out_channel;
	}
	printf("consumer: %zu bytes echoed intact through node %lu port %lu\n", got, node, port);
	status = 0;
out_channel:
	mesh_close(c);
out_session:
	mesh_session_close(s);
	return status;
}
