# cmake -DF=<elf file> -DR=<run path> -P cmake_rpath.cmake: sets the run
# path of a bundled module or tool (setup.py; CMake >= 3.21).
file(RPATH_SET FILE "${F}" NEW_RPATH "${R}")
