/* host_std.h — the standard headers of the TT-Metal CPU model's host side (tt-metalium/*.hpp) and
 * of its kernel side (model_std.h); precompiled by build.py as model_std.h is. */
#ifndef OPGEN_TTMETAL_MODEL_HOST_STD_H
#define OPGEN_TTMETAL_MODEL_HOST_STD_H

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "model_std.h"

#endif
