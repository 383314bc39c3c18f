# Third-party dependencies: LibTorch from the machine-wide venv that tools/setup.sh creates, the rest from Debian.

# ---- LibTorch -----------------------------------------------------------------------------------------------------
# tools/setup.sh installs the pinned PyPI `torch` wheel into $TESSERA_HOME/venv (default ~/.cache/tessera/venv). The
# wheel ships LibTorch's CMake package; find it there unless the user points Torch_DIR elsewhere.
if(NOT Torch_DIR)
  set(_tessera_home "$ENV{TESSERA_HOME}")
  if(NOT _tessera_home)
    set(_tessera_home "$ENV{HOME}/.cache/tessera")
  endif()
  file(GLOB _torch_dirs "${_tessera_home}/venv/lib/python3*/site-packages/torch/share/cmake/Torch")
  if(NOT _torch_dirs)
    message(FATAL_ERROR "LibTorch not found under ${_tessera_home}/venv. Run tools/setup.sh first "
                        "(or set TESSERA_HOME, or pass -DTorch_DIR=<...>/torch/share/cmake/Torch).")
  endif()
  list(GET _torch_dirs 0 _torch_dir)
  set(Torch_DIR "${_torch_dir}" CACHE PATH "LibTorch CMake package (from the torch wheel)")
endif()

# The wheel is the CUDA 13 build; CUDA's runtime comes from the nvidia wheels beside it, no toolkit needed
# (cmake/TesseraTorchCuda.cmake). Nothing here needs a GPU to configure or link.
include(TesseraTorchCuda)
tessera_torch_cuda("${Torch_DIR}")
find_package(Torch REQUIRED)

# The venv's interpreter runs tests/compat/ (real Python peers); Torch_DIR is <venv>/lib/python3.X/site-packages/
# torch/share/cmake/Torch, so the venv is seven levels up.
if(NOT TESSERA_PYTHON)
  get_filename_component(_venv "${Torch_DIR}/../../../../../../.." ABSOLUTE)
  set(TESSERA_PYTHON "${_venv}/bin/python" CACHE FILEPATH "Python with the compatibility peers (tools/requirements-test.txt)")
endif()
# Composer + LLM Foundry live in a venv of their own beside it (tools/setup_composer.sh): they pin another torch.
if(NOT TESSERA_COMPOSER_PYTHON)
  get_filename_component(_home "${TESSERA_PYTHON}/../../.." ABSOLUTE)
  set(TESSERA_COMPOSER_PYTHON "${_home}/venv-composer/bin/python" CACHE FILEPATH
      "Python with Composer and LLM Foundry (tools/setup_composer.sh)")
endif()
# transformers 5 lives in a venv of its own beside it (tools/setup_tf5.sh): the main venv's transformers is 4.x.
if(NOT TESSERA_TF5_PYTHON)
  get_filename_component(_home "${TESSERA_PYTHON}/../../.." ABSOLUTE)
  set(TESSERA_TF5_PYTHON "${_home}/venv-tf5/bin/python" CACHE FILEPATH "Python with transformers 5 (tools/setup_tf5.sh)")
endif()
message(STATUS "LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# Torch's include directory carries its own fmt (12.x) headers, which would shadow Debian's fmt 9 that spdlog and
# libfmt.so are built against. Put Debian's fmt first through a one-entry include directory. The torch headers we use
# (ATen, torch/nn, torch/optim) do not include fmt; only profiler/CUDA-tunable internals do.
set(TESSERA_FMT_SHIM ${CMAKE_BINARY_DIR}/fmt-shim)
if(NOT EXISTS ${TESSERA_FMT_SHIM}/fmt)
  file(MAKE_DIRECTORY ${TESSERA_FMT_SHIM})
  file(CREATE_LINK /usr/include/fmt ${TESSERA_FMT_SHIM}/fmt SYMBOLIC)
endif()

# ---- Apache Arrow C++ with Parquet --------------------------------------------------------------------------------
# Debian 12 packages no Arrow; the pinned `pyarrow` wheel in the same venv ships Arrow's and Parquet's C++ shared
# libraries and headers (built with the C++11 ABI, as LibTorch's wheel is), so it is taken from there as LibTorch is
# (docs/data.md#readers). Only src/data/records.cpp uses it.
if(NOT TESSERA_PYARROW_DIR)
  get_filename_component(_venv_for_arrow "${Torch_DIR}/../../../../../../.." ABSOLUTE)
  file(GLOB _pyarrow_dirs "${_venv_for_arrow}/lib/python3*/site-packages/pyarrow")
  if(NOT _pyarrow_dirs)
    message(FATAL_ERROR "Apache Arrow C++ not found: no pyarrow wheel in ${_venv_for_arrow}. Run tools/setup.sh "
                        "(or pass -DTESSERA_PYARROW_DIR=<...>/site-packages/pyarrow).")
  endif()
  list(GET _pyarrow_dirs 0 _pyarrow_dir)
  set(TESSERA_PYARROW_DIR "${_pyarrow_dir}" CACHE PATH "The pyarrow wheel's folder (Arrow/Parquet C++ libraries)")
endif()
file(GLOB _arrow_libs "${TESSERA_PYARROW_DIR}/libarrow.so.[0-9]*")
file(GLOB _parquet_libs "${TESSERA_PYARROW_DIR}/libparquet.so.[0-9]*")
if(NOT _arrow_libs OR NOT _parquet_libs OR NOT EXISTS "${TESSERA_PYARROW_DIR}/include/parquet/arrow/reader.h")
  message(FATAL_ERROR "${TESSERA_PYARROW_DIR} lacks libarrow, libparquet or their headers")
endif()
list(GET _arrow_libs 0 _arrow_lib)
list(GET _parquet_libs 0 _parquet_lib)
# Linked by full path (the wheel has no unversioned names), so an installed Tessera's package names them too.
set(TESSERA_ARROW_LIBS "${_parquet_lib};${_arrow_lib}")
set(TESSERA_ARROW_INCLUDE "${TESSERA_PYARROW_DIR}/include")
message(STATUS "Apache Arrow C++: ${_arrow_lib}")

# ---- Debian packages ------------------------------------------------------------------------------------------------
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(CURL REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# expat parses the XML of S3's and STS's answers (util/xml.h).
find_package(EXPAT REQUIRED)
# zstd 1.5.7, built here from the sources tools/setup.sh unpacks (the PyPI `zstd` sdist bundles them): MDS shards are
# compressed as Streaming's `zstd` module compresses them (zstd 1.5.7, multithreaded framing), which Debian's 1.5.4
# does not reproduce byte for byte. Static, with hidden symbols, so it never interposes on the libzstd that other
# libraries (curl, ...) load.
if(NOT TESSERA_ZSTD_SOURCE)
  set(_tessera_home_zstd "$ENV{TESSERA_HOME}")
  if(NOT _tessera_home_zstd)
    set(_tessera_home_zstd "$ENV{HOME}/.cache/tessera")
  endif()
  set(TESSERA_ZSTD_SOURCE "${_tessera_home_zstd}/src/zstd-1.5.7.2/zstd/lib" CACHE PATH "zstd 1.5.7's lib/ folder")
endif()
if(NOT EXISTS "${TESSERA_ZSTD_SOURCE}/zstd.h")
  message(FATAL_ERROR "zstd 1.5.7 sources not found at ${TESSERA_ZSTD_SOURCE}. Run tools/setup.sh first.")
endif()
enable_language(C)
file(GLOB _zstd_sources "${TESSERA_ZSTD_SOURCE}/common/*.c" "${TESSERA_ZSTD_SOURCE}/compress/*.c"
     "${TESSERA_ZSTD_SOURCE}/decompress/*.c")
add_library(tessera_zstd STATIC ${_zstd_sources})
target_include_directories(tessera_zstd SYSTEM PUBLIC "${TESSERA_ZSTD_SOURCE}")
target_compile_definitions(tessera_zstd PRIVATE ZSTD_MULTITHREAD ZSTD_DISABLE_ASM)
set_target_properties(tessera_zstd PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden
                                              UNITY_BUILD OFF)
target_link_libraries(tessera_zstd PRIVATE Threads::Threads)
set(TESSERA_ZSTD_LIB tessera_zstd)
find_library(TESSERA_XXHASH_LIB xxhash REQUIRED)
# The tokenizer: PCRE2 (JIT) for pre-tokenizer patterns, ICU for NFC and Unicode properties.
find_library(TESSERA_PCRE2_LIB pcre2-8 REQUIRED)
find_path(TESSERA_PCRE2_INCLUDE pcre2.h REQUIRED)
find_package(ICU REQUIRED COMPONENTS uc)
# The multi-job planner's MILP solver: COIN-OR CBC (Debian's coinor-libcbc-dev), through its C interface.
find_library(TESSERA_CBC_LIB CbcSolver REQUIRED)
find_path(TESSERA_CBC_INCLUDE coin/Cbc_C_Interface.h REQUIRED)
# `tessera serve`'s HTTP server: cpp-httplib (Debian's libcpp-httplib-dev, a compiled library; its pkg-config flags
# say which of its features it was built with, which the header's declarations must match).
find_package(PkgConfig REQUIRED)
pkg_check_modules(TESSERA_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
if(TESSERA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
