# The precompiled header (src/CMakeLists.txt) holds LibTorch's ATen headers and is large (~700 MB with -g). Loading
# it costs every translation unit 4-5 s (9 s under ASan), and clang-tidy walks its whole AST for every file. Only the
# translation units that include LibTorch need it; about 40% of ours include no LibTorch header at all (the
# tokenizer, the recipe reader, storage, the launcher, ...), and those compile without it:
#
#   tessera_use_pch(TARGET)          TARGET uses libtessera's precompiled header (REUSE_FROM), where needed
#   tessera_skip_pch_where_unused(TARGET)   the sources of TARGET that need no LibTorch skip its precompiled header
#
# "Needs LibTorch" is read from the #include lines at configure time: a file that includes <torch/...>, <ATen/...> or
# <c10/...>, or one of our headers that does (followed through "..." includes, resolved against the file's folder,
# include/ and tests/unit/). A classification gone stale after an edit only costs time, never correctness: each file
# compiles with or without the precompiled header, since it includes what it uses (which this also keeps checked).

# Sets OUT to ON when FILE includes LibTorch, directly or through our headers. Memoised per file in global properties.
function(_tessera_includes_torch file out)
  get_property(known GLOBAL PROPERTY "TESSERA_INCLUDES_TORCH:${file}" SET)
  if(known)
    get_property(value GLOBAL PROPERTY "TESSERA_INCLUDES_TORCH:${file}")
    set(${out} ${value} PARENT_SCOPE)
    return()
  endif()
  # Provisional answer while this file's includes are followed (headers that include each other).
  set_property(GLOBAL PROPERTY "TESSERA_INCLUDES_TORCH:${file}" OFF)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  get_filename_component(dir "${file}" DIRECTORY)
  set(torch OFF)
  foreach(line IN LISTS lines)
    if(line MATCHES "include[ \t]*<(torch|ATen|c10)/")
      set(torch ON)
      break()
    endif()
    if(NOT line MATCHES "include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(header "${CMAKE_MATCH_1}")
    foreach(base IN ITEMS "${dir}" "${PROJECT_SOURCE_DIR}/include" "${PROJECT_SOURCE_DIR}/src/include"
                        "${PROJECT_SOURCE_DIR}/tests/unit")
      if(EXISTS "${base}/${header}")
        get_filename_component(path "${base}/${header}" ABSOLUTE)
        _tessera_includes_torch("${path}" header_torch)
        if(header_torch)
          set(torch ON)
        endif()
        break()
      endif()
    endforeach()
    if(torch)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "TESSERA_INCLUDES_TORCH:${file}" ${torch})
  set(${out} ${torch} PARENT_SCOPE)
endfunction()

function(tessera_skip_pch_where_unused target)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.(cpp|cc)$")
      continue()
    endif()
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${source_dir}")
    _tessera_includes_torch("${path}" torch)
    if(NOT torch)
      set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

function(tessera_use_pch target)
  target_precompile_headers(${target} REUSE_FROM tessera)
  tessera_skip_pch_where_unused(${target})
endfunction()
