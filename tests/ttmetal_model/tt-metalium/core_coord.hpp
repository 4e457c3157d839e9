/* tt-metalium/core_coord.hpp — opgen's TT-Metal CPU model: CoreCoord, CoreRange, CoreRangeSet and
 * corerange_to_cores live in host_api.hpp */
#pragma once
#include "tt-metalium/host_api.hpp"
