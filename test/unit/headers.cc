/* The public headers compile alone, pedantic C11 (and as C++ in headers.cc). */
#include <stagelink/loader.h>
#include <stagelink/stagelink.h>

#include <string.h>

int main(void)
{
    stagelink_plugin_v1_t v;

    memset(&v, 0, sizeof(v));
    v.abi_version = STAGELINK_ABI_VERSION_1;
    return (stagelink_status_string(STAGELINK_SUCCESS) != NULL &&
            v.abi_version == 1) ? 0 : 1;
}
