/* emulator stand-in (tests/cuda_emu/cuda_emu.h) */
#include "../../cuda_emu.h"
