/* tt-metalium/circular_buffer_constants.h — opgen's TT-Metal CPU model. The real 0.81.1 header
 * (shipped in the ttnn wheel) sets NUM_CIRCULAR_BUFFERS to 32 on Wormhole and 64 elsewhere; the
 * model is a Wormhole core (32 CBs). */
#pragma once

#include <cstdint>

inline constexpr std::uint32_t NUM_CIRCULAR_BUFFERS = 32;
