/* A library that is no stagelink plugin: it lacks stagelink_plugin_v1. */
#include <stagelink/stagelink.h>

__attribute__((visibility("default"))) const int stagelink_plugin_v0 = 0;
