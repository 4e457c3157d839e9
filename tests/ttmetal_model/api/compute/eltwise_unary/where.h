/* opgen TT-Metal CPU model: the whole compute API is in ttmetal_model_compute.h */
#pragma once
#include "ttmetal_model_compute.h"
