/*
 * The provider a transport-level test runs over, from the environment: MESH_XPORT (tcp | rdma,
 * default tcp), MESH_XPORT_ADDR (default 127.0.0.1), MESH_XPORT_PORT (first port; default from the
 * pid). Exits 77 (skipped, with the reason) when the provider cannot serve the address here, or 1
 * instead with MESH_REQUIRE_RDMA=1; 2 for an unknown provider.
 */
#ifndef MESH_TESTS_PROVIDER_ENV_H
#define MESH_TESTS_PROVIDER_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport.h"

static const struct xport_ops *provider_from_env(const char *prog, const char **addr, uint16_t *port,
						 unsigned default_base)
{
	const char *name = getenv("MESH_XPORT");
	const char *p = getenv("MESH_XPORT_PORT");
	const char *req = getenv("MESH_REQUIRE_RDMA");
	const struct xport_ops *ops = xport_ops_find(name && *name ? name : "tcp");

	*addr = getenv("MESH_XPORT_ADDR");
	if (!*addr || !**addr)
		*addr = "127.0.0.1";
	if (!ops) {
		fprintf(stderr, "%s: unknown provider %s\n", prog, name);
		exit(2);
	}
	if (!ops->probe(*addr)) {
		printf("skip: the %s provider cannot serve %s on this machine\n", ops->name, *addr);
		exit(req && !strcmp(req, "1") ? 1 : 77);
	}
	/* Below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 on): a listening port
	 * picked inside it collided now and then with another program's outgoing connection ("Address
	 * already in use" in a loaded CI run). Each test's base leaves it 2,000 ports of its own. */
	*port = p ? (uint16_t)atoi(p) : (uint16_t)(default_base + (unsigned)getpid() % 2000);
	printf("# provider %s, address %s, ports from %u\n", ops->name, *addr, *port);
	return ops;
}

#endif
