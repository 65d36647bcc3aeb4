/*
 * Node identity (sl_node.c) under hostnames of every length the kernel
 * allows (64: a cloud FQDN), each set in a UTS namespace of its own in a
 * forked child (root; skipped without): two hosts whose long names differ
 * only at the end are two nodes, one name is one node, and the id fits.
 *   test_node
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "sl_node.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP 77

/* The node id a process of hostname `host` gets: 0, SKIP, or 1. */
static int id_as(const char *host, char id[SL_NODE_ID_LEN])
{
    int   fd[2], status;
    pid_t pid;

    if (pipe(fd) != 0 || (pid = fork()) < 0) {
        return 1;
    }
    if (pid == 0) {
        char        mine[SL_NODE_ID_LEN] = {0};
        sl_errbuf_t eb                   = {0};

        close(fd[0]);
        unsetenv("STAGELINK_NODE_ID");
        if (unshare(CLONE_NEWUTS) != 0) {
            _exit(errno == EPERM ? SKIP : 1);
        }
        if (sethostname(host, strlen(host)) != 0 ||
            sl_node_id(mine, &eb) != STAGELINK_SUCCESS ||
            write(fd[1], mine, sizeof(mine)) != (ssize_t)sizeof(mine)) {
            _exit(1);
        }
        _exit(0);
    }
    close(fd[1]);
    memset(id, 0, SL_NODE_ID_LEN);
    if (read(fd[0], id, SL_NODE_ID_LEN) != SL_NODE_ID_LEN) {
        id[0] = '\0';
    }
    close(fd[0]);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void)
{
    /* 63 and 64 characters, differing only in the last: two EC2 nodes. */
    const char *a = "ip-172-31-45-123.ap-northeast-1.compute.internal.cluster-zone-a";
    const char *b = "ip-172-31-45-123.ap-northeast-1.compute.internal.cluster-zone-b";
    const char *c = "ip-172-31-45-123.ap-northeast-1.compute.internal.cluster-zone-ab";
    char        ida[SL_NODE_ID_LEN], idb[SL_NODE_ID_LEN], idc[SL_NODE_ID_LEN];
    char        again[SL_NODE_ID_LEN], shorter[SL_NODE_ID_LEN];
    int         rc;

    rc = id_as(a, ida);
    if (rc == SKIP) {
        printf("SKIP: no UTS namespace (needs root)\n");
        return SKIP;
    }
    CHECK(rc == 0, "node id under a 63-character hostname: exit %d", rc);
    CHECK(id_as(b, idb) == 0 && id_as(c, idc) == 0 && id_as(a, again) == 0,
          "node ids under the other hostnames");
    CHECK(strcmp(ida, idb) != 0 && strcmp(ida, idc) != 0 &&
          strcmp(idb, idc) != 0, "hosts %s, %s and %s are one node: %s, %s, "
          "%s", a, b, c, ida, idb, idc);
    CHECK(strcmp(ida, again) == 0, "one host, two ids: %s and %s", ida, again);
    CHECK(strncmp(ida, "ip-172-31-45-123", 16) == 0 &&
          strlen(idc) < SL_NODE_ID_LEN, "ids keep the name's head and fit: "
          "%s, %s", ida, idc);
    CHECK(id_as("node07", shorter) == 0 &&
          strncmp(shorter, "node07/", 7) == 0, "a short name is kept "
          "whole: %s", shorter);
    return check_summary();
}
