/*
 * Which RDMA NICs rail selection may use: an include or exclude list in
 * NCCL_IB_HCA's syntax, and a speed floor that keeps storage and
 * management ports out of the training traffic.  A NIC left out keeps its
 * place in the list with the reason, so stagelink_info shows why.
 * SPDX-License-Identifier: MIT
 */
#include "sl_topo.h"
#include "sl_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Does `nic` match one entry "name[:port]" of a list (exact or prefix)? */
static int sl_hca_entry_match(const sl_topo_nic_t *nic, const char *entry,
                              size_t len, int exact)
{
    const char *colon = memchr(entry, ':', len);
    size_t      name_len = colon ? (size_t)(colon - entry) : len;

    if (name_len == 0 || strncmp(nic->name, entry, name_len) != 0 ||
        (exact && nic->name[name_len] != '\0')) {
        return 0;
    }
    return colon == NULL || atoi(colon + 1) == nic->port;
}

/* Does `nic` match any entry of the comma list `list`? */
static int sl_hca_list_match(const sl_topo_nic_t *nic, const char *list,
                             int exact)
{
    while (*list != '\0') {
        size_t len = strcspn(list, ",");

        if (len > 0 && sl_hca_entry_match(nic, list, len, exact)) {
            return 1;
        }
        list += len + (list[len] == ',');
    }
    return 0;
}

sl_status_t sl_nic_floor(double *gbps, sl_errbuf_t *eb)
{
    sl_env_value_t v;

    SL_CHECK(sl_env_parse(SL_ENV_NIC_MIN_GBPS, &v, eb));
    *gbps = v.is_auto ? -1.0 : v.real;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_topo_filter_nics(sl_topo_t *t, sl_errbuf_t *eb)
{
    sl_env_value_t hca;
    const char    *spec, *from = "STAGELINK_IB_HCA";
    const char    *list;
    double         floor_gbps, fastest = 0.0;
    int            exclude = 0, exact = 0, i;

    SL_CHECK(sl_nic_floor(&floor_gbps, eb));
    SL_CHECK(sl_env_parse(SL_ENV_IB_HCA, &hca, eb));
    if (hca.text == NULL) {
        SL_CHECK(sl_env_parse(SL_ENV_NCCL_IB_HCA, &hca, eb));
        from = "NCCL_IB_HCA";
    }
    spec = hca.text;
    list = (spec != NULL) ? spec : "";
    exclude = (list[0] == '^');
    list += exclude;
    exact = (list[0] == '=');
    list += exact;
    for (i = 0; i < t->nnics; ++i) {
        sl_topo_nic_t *nic = &t->nics[i];

        nic->skip[0] = '\0';
        if (spec != NULL && sl_hca_list_match(nic, list, exact) == exclude) {
            snprintf(nic->skip, sizeof(nic->skip), "%s by %s=%s",
                     exclude ? "excluded" : "not included", from, spec);
        } else if (nic->active && nic->gbps > fastest) {
            fastest = nic->gbps; /* of those the list keeps */
        }
    }
    if (floor_gbps < 0.0) {
        floor_gbps = fastest / 2.0;
    }
    for (i = 0; i < t->nnics; ++i) {
        sl_topo_nic_t *nic = &t->nics[i];

        if (nic->skip[0] == '\0' && nic->gbps > 0.0 && nic->gbps < floor_gbps) {
            snprintf(nic->skip, sizeof(nic->skip), "%.0f Gb/s, below "
                     "STAGELINK_NIC_MIN_GBPS=%s (%.0f Gb/s)", nic->gbps,
                     sl_env_get(SL_ENV_NIC_MIN_GBPS), floor_gbps);
        }
    }
    return STAGELINK_SUCCESS;
}
