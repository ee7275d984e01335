# Registers a gtest binary's tests with ctest in groups, one process per group (Note [Unit tests
# in groups] in tests/CMakeLists.txt). Run after the binary is built (cmake -P), like CMake's
# gtest_discover_tests, it lists the tests and writes OUT, which ctest includes.
#   cmake -DBIN=... -DOUT=... -DRUNNER=gtest_chunk.sh -DENVIRONMENT=... -DWORKDIR=... -DCHUNK=8
#         [-DALONE=REGEX] -P gtest_groups.cmake
# A suite's tests go in runs of at most CHUNK, named SUITE (one group) or SUITE/K (the K-th);
# suites of fewer tests share a group, up to CHUNK tests, named SUITE1+SUITE2+... (each process
# loads libtorch: ~0.8 s of CPU, for suites of a few milliseconds' tests); a test whose
# SUITE.NAME matches ALONE is a group of its own, named SUITE.NAME.
execute_process(COMMAND "${BIN}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc
                ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REGEX REPLACE "  #[^\n]*" "" listing "${listing}")  # parameter comments
string(REPLACE ";" "" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")

set(script "# Written by tests/gtest_groups.cmake from ${BIN} --gtest_list_tests\n")
set(groups "")
macro(emit name filter)
  string(APPEND script "add_test([==[${name}]==] bash [==[${RUNNER}]==] [==[${BIN}]==] [==[--gtest_filter=${filter}]==])\n"
         "set_tests_properties([==[${name}]==] PROPERTIES LABELS unit SKIP_RETURN_CODE 77"
         " WORKING_DIRECTORY [==[${WORKDIR}]==] ENVIRONMENT [==[${ENVIRONMENT}]==])\n")
endmacro()
# The suites packed so far (fewer than CHUNK tests each): one group.
set(pack_names "")
set(pack_filter "")
set(pack_n 0)
macro(flush_pack)
  if(pack_n GREATER 0)
    string(REGEX REPLACE ":$" "" pack_filter "${pack_filter}")
    emit("${pack_names}" "${pack_filter}")
  endif()
  set(pack_names "")
  set(pack_filter "")
  set(pack_n 0)
endmacro()
macro(flush_suite)
  list(LENGTH members n)
  if(suite AND n GREATER 0 AND n LESS CHUNK)
    math(EXPR total "${pack_n} + ${n}")
    if(total GREATER CHUNK)
      flush_pack()
    endif()
    if(pack_names)
      string(APPEND pack_names "+")
    endif()
    string(APPEND pack_names "${suite}")
    foreach(t IN LISTS members)
      string(APPEND pack_filter "${suite}.${t}:")
    endforeach()
    math(EXPR pack_n "${pack_n} + ${n}")
  elseif(suite AND n GREATER 0)
    math(EXPR parts "(${n} + ${CHUNK} - 1) / ${CHUNK}")
    set(k 0)  # groups emitted
    set(i 0)  # tests in the group being filled
    set(filter "")
    foreach(t IN LISTS members)
      string(APPEND filter "${suite}.${t}:")
      math(EXPR i "${i} + 1")
      math(EXPR left "${n} - ${k} * ${CHUNK} - ${i}")
      if(i EQUAL CHUNK OR left EQUAL 0)
        math(EXPR k "${k} + 1")
        string(REGEX REPLACE ":$" "" filter "${filter}")
        if(parts EQUAL 1)
          emit("${suite}" "${filter}")
        else()
          emit("${suite}/${k}" "${filter}")
        endif()
        set(i 0)
        set(filter "")
      endif()
    endforeach()
  endif()
  set(members "")
endmacro()

set(suite "")
set(members "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ].*)\\.$")
    set(next "${CMAKE_MATCH_1}")  # before flush_suite(), whose regex resets CMAKE_MATCH_1
    flush_suite()
    set(suite "${next}")
  elseif(line MATCHES "^  ([^ ]+)" AND suite)
    set(t "${CMAKE_MATCH_1}")
    if(ALONE AND "${suite}.${t}" MATCHES "${ALONE}")
      emit("${suite}.${t}" "${suite}.${t}")
    else()
      list(APPEND members "${t}")
    endif()
  endif()
endforeach()
flush_suite()
flush_pack()
file(WRITE "${OUT}" "${script}")
