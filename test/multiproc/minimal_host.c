/* The minimal host of docs/c-api.md: stage 0 sends a tensor, stage 1 receives it. */
#include <stagelink/loader.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    stagelink_loader_t          *loader;
    const stagelink_plugin_v1_t *sl;
    stagelink_comm_t            *comm;
    stagelink_comm_info_t        info;
    stagelink_request_t         *req;
    stagelink_config_t           cfg  = {.struct_size = sizeof(cfg), .tp_size = 1};
    static float                 act[1024];
    char                         err[1024];
    stagelink_xfer_t             x = {.buf = act, .nbytes = sizeof(act),
                                      .elem_size = sizeof(float),
                                      .tag = {.microbatch = 0}};

    /* STAGELINK_PLUGIN picks the plugin (default ucx); ranks come from the launcher. */
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) ||
        stagelink_loader_comm_init(loader, &cfg, &comm, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    sl = stagelink_loader_plugin(loader);
    sl->comm_info(comm, &info);
    if (info.next_rank >= 0) {             /* send_forward */
        for (int i = 0; i < 1024; ++i) act[i] = (float)i;
        x.peer = STAGELINK_PEER_NEXT;
        sl->isend(comm, &x, &req);
    } else {                               /* recv_forward */
        x.peer = STAGELINK_PEER_PREV;
        sl->irecv(comm, &x, &req);
    }
    if (sl->wait(comm, req) != STAGELINK_SUCCESS) {
        fprintf(stderr, "%s\n", sl->last_error(comm));
        return 1;
    }
    if (info.prev_rank >= 0 && act[1023] != 1023.0f) {
        fprintf(stderr, "wrong data\n");
        return 1;
    }
    sl->comm_finalize(comm);
    stagelink_loader_close(loader);
    return 0;
}
