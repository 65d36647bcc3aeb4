/*
 * Invalid values of every variable, from the table itself: for each entry
 * whose type can be wrong, values it must refuse, one "NAME<TAB>VALUE<TAB>SCOPE"
 * line each (scope: lib, a launcher's, or tools), for
 * test/fault/env_sweep.sh.
 * SPDX-License-Identifier: MIT
 */
#include "sl_env.h"

#include <inttypes.h>
#include <stdio.h>

int main(void)
{
    int id;

    for (id = 0; id < SL_ENV_COUNT; ++id) {
        const sl_env_entry_t *e = &sl_env_table[id];
        /* lib: comm_init checks it on every rank before any exchange. */
        const char *scope = (e->flags & SL_ENV_F_LAUNCHER) ? "foreign"
                            : (e->flags & SL_ENV_F_TOOLS) ? "tools" : "lib";
        const char *bad[3] = {NULL, NULL, NULL};
        char        over[32] = "";
        int         i;

        switch (e->type) {
        case SL_ENV_T_BOOL:    bad[0] = "maybe"; bad[1] = "2"; break;
        case SL_ENV_T_INT:
        case SL_ENV_T_SIZE:
            bad[0] = (e->type == SL_ENV_T_INT) ? "12x" : "1Q";
            bad[1] = "-1";
            if (e->max < UINT64_MAX) {
                snprintf(over, sizeof(over), "%" PRIu64, e->max + 1);
                bad[2] = over;
            }
            break;
        case SL_ENV_T_SECONDS: bad[0] = "soon"; bad[1] = "-1"; break;
        case SL_ENV_T_NUMBER:  bad[0] = "fast"; bad[1] = "-1"; break;
        case SL_ENV_T_ENUM:    bad[0] = "no-such-choice"; break;
        case SL_ENV_T_LIST:    bad[0] = "NO_SUCH_ITEM"; bad[1] = ","; break;
        case SL_ENV_T_DIRS:    bad[0] = "/no/such/stagelink/dir"; break;
        case SL_ENV_T_NICS:    bad[0] = "^"; bad[1] = "mlx5_0:x"; break;
        case SL_ENV_T_STRING:  break; /* any text is one */
        }
        for (i = 0; i < 3 && bad[i] != NULL; ++i) {
            printf("%s\t%s\t%s\n", e->pub.name, bad[i], scope);
        }
    }
    return 0;
}
