# ctest driver: install the build tree into a scratch prefix, build the consumer against it
# with find_package(swapnet), and run it. Any failing step fails the test.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}")
  endif()
endfunction()
file(REMOVE_RECURSE ${WORK})
step(${CMAKE_COMMAND} --install ${SWAPNET_BUILD} --prefix ${WORK}/prefix)
step(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${WORK}/build -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build ${WORK}/build)
step(${WORK}/build/consumer ${MODEL})
