/*
 * Which transports UCX offers and which an endpoint took, read from UCX's
 * own reports (ucp_context_print_info, ucp_ep_print_info): the same-node
 * worker is built from the first, and every endpoint's lanes are logged
 * from the second, so a test on simulated nodes can read them.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_ucx_tl_local(const char *tl, size_t len)
{
    static const char *const local[] = {"self", "sysv", "posix", "cma",
                                        "knem", "xpmem", "cuda_ipc",
                                        "cuda_copy", "gdr_copy"};
    size_t i;

    for (i = 0; i < SL_ARRAY_SIZE(local); ++i) {
        if (strlen(local[i]) == len && strncmp(tl, local[i], len) == 0) {
            return 1;
        }
    }
    return 0;
}

int sl_ucx_context_tls(ucp_context_h ctx, sl_ucx_tl_cb_t cb, void *arg)
{
    char   *text = NULL, *line, *save = NULL;
    size_t  size = 0;
    FILE   *f    = open_memstream(&text, &size);
    int     n    = 0;

    if (f == NULL) {
        return 0;
    }
    ucp_context_print_info(ctx, f);
    fclose(f);
    /* "#  resource 3 :  md 2  dev 0  flags -- posix/memory" */
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *tl = strstr(line, "flags -- "), *slash;

        if (tl == NULL || (slash = strchr(tl += 9, '/')) == NULL) {
            continue;
        }
        cb(arg, tl, (size_t)(slash - tl), slash + 1);
        ++n;
    }
    free(text);
    return n;
}

/* "lane[0]:  3:sysv/memory.0 md[2] ..." -> "sysv/memory.0", its name's
 * length without the device in *tl_len. */
static const char *sl_ucx_lane_tl(const char *line, size_t *len,
                                  size_t *tl_len)
{
    const char *lane = strstr(line, "lane["), *tl, *slash;

    if (lane == NULL || (tl = strchr(lane + 5, ':')) == NULL ||
        (tl = strchr(tl + 1, ':')) == NULL) {
        return NULL;
    }
    ++tl;
    *len    = strcspn(tl, " ");
    slash   = memchr(tl, '/', *len);
    *tl_len = (slash != NULL) ? (size_t)(slash - tl) : *len;
    return tl;
}

static void sl_ucx_append(char *out, size_t cap, size_t *used,
                          const char *what, size_t len)
{
    int n = snprintf(out + *used, cap - *used, "%s%.*s", *used ? " " : "",
                     (int)len, what);

    *used += (n > 0 && (size_t)n < cap - *used) ? (size_t)n : 0;
}

/*
 * A same-node endpoint over a network transport is warned about, once a
 * communicator: it is possible only where the same-node worker could not
 * be made (which warned already) or UCX_TLS set by the user leaves out
 * shared memory.
 */
void sl_ucx_ep_lanes(sl_ucx_peer_t *peer)
{
    sl_comm_t *comm = peer->comm;
    char  *text = NULL, lanes[256] = "", network[128] = "";
    size_t size = 0, used = 0, net = 0, len, tl_len;
    FILE  *f = open_memstream(&text, &size);
    char  *line, *save = NULL;
    const char *tl;

    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(peer->ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if ((tl = sl_ucx_lane_tl(line, &len, &tl_len)) == NULL) {
            continue;
        }
        sl_ucx_append(lanes, sizeof(lanes), &used, tl, len);
        if (!sl_ucx_tl_local(tl, tl_len)) {
            sl_ucx_append(network, sizeof(network), &net, tl, len);
        }
    }
    free(text);
    SL_INFO(SL_SUBSYS_NET, "endpoint to rank %d: %s over %s (%s worker)",
            peer->rank, peer->inter_node ? "other node" : "same node",
            lanes[0] ? lanes : "(no lanes reported)",
            peer->local ? "same-node" : "main");
    if (!peer->inter_node && network[0] != '\0') {
        sl_log(comm->lanes_warned ? SL_LOG_INFO : SL_LOG_WARN, SL_SUBSYS_NET,
               "the endpoint to rank %d, on this node, runs over %s, a "
               "network transport: same-node bytes cross a NIC, not shared "
               "memory or NVLink (UCX %s; UCX_TLS leaves out shared memory, "
               "or no same-node transport works here)", peer->rank, network,
               ucp_get_version_string());
        comm->lanes_warned = 1;
    }
}
