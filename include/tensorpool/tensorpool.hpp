// tensorpool/tensorpool.hpp: the whole public API of the core library.
#pragma once

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/device.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/hooks.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/size_classes.hpp"
#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"
