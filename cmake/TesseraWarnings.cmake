# Warnings for Tessera's own targets (not for third-party headers, which come in as SYSTEM includes).
add_library(tessera_warnings INTERFACE)
target_compile_options(tessera_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual
  -Wno-unused-parameter)
if(TESSERA_WERROR)
  target_compile_options(tessera_warnings INTERFACE -Werror)
endif()
