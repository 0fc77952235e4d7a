#include <string.h>

#include "transport.h"

static const struct xport_ops *const xport_providers[] = {
	&xport_rdma_ops,
	&xport_tcp_ops,
};

const struct xport_ops *xport_ops_find(const char *name)
{
	for (size_t i = 0; i < sizeof(xport_providers) / sizeof(xport_providers[0]); i++)
		if (!strcmp(xport_providers[i]->name, name))
			return xport_providers[i];
	return NULL;
}
