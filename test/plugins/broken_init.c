/* A plugin whose init always fails with its own sentence. */
#include <stagelink/stagelink.h>

#include <stddef.h>

static stagelink_status_t fail_init(const stagelink_config_t *config,
                                    stagelink_comm_t **comm)
{
    (void)config;
    *comm = NULL;
    return STAGELINK_ERR_INIT;
}

static const char *fail_error(stagelink_comm_t *comm)
{
    (void)comm;
    return "deliberate init failure of the test plugin";
}

__attribute__((visibility("default")))
const stagelink_plugin_v1_t stagelink_plugin_v1 = {
    .abi_version = STAGELINK_ABI_VERSION_1,
    .struct_size = sizeof(stagelink_plugin_v1_t),
    .name        = "broken-init",
    .version     = "0",
    .comm_init   = fail_init,
    .last_error  = fail_error,
};
