/* model_std.h — the standard headers of the TT-Metal CPU model's kernel side (ttmetal_model.h and
 * the api/ headers). build.py precompiles this file (and host_std.h) once per compiler and flags, and
 * every kernel and host program is compiled with `-include` of the precompiled copy: parsing these
 * headers was most of a kernel's compile time. An include guard, not #pragma once: the copy and this
 * file are one header to the preprocessor. */
#ifndef OPGEN_TTMETAL_MODEL_STD_H
#define OPGEN_TTMETAL_MODEL_STD_H

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#endif
