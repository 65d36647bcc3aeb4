/* A plugin of an ABI this host does not speak. */
#include <stagelink/stagelink.h>

__attribute__((visibility("default")))
const stagelink_plugin_v1_t stagelink_plugin_v1 = {
    .abi_version = 99,
    .struct_size = sizeof(stagelink_plugin_v1_t),
    .name        = "future",
    .version     = "99.0",
};
