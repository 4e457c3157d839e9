/* tt-metalium/tensor_accessor_args.hpp — opgen's TT-Metal CPU model: the host TensorAccessorArgs lives in
 * distributed.hpp (it takes a MeshBuffer) */
#pragma once
#include "tt-metalium/distributed.hpp"
