/* tt-metalium/work_split.hpp — opgen's TT-Metal CPU model: split_work_to_cores (semantics of tt-metal's
 * work_split.hpp; docs/ttmetal_model.md). The cores are taken in order from (0,0): column by column
 * (default) or row by row (row_wise). With U units on a grid of G cores, min(U, G) cores get work; the
 * first U % n of them (group 1) take ceil(U / n) units, the rest (group 2) floor(U / n). When n divides U,
 * group 1 is every core and group 2 is empty. */
#ifndef OPGEN_TTMETAL_MODEL_WORK_SPLIT_HPP
#define OPGEN_TTMETAL_MODEL_WORK_SPLIT_HPP

#include <algorithm>
#include <tuple>

#include "tt-metalium/host_api.hpp"

namespace tt::tt_metal {

namespace detail {
/* the cores with linear indices [first, first + n) of `grid` (column-major, or row-major when row_wise) as ranges:
 * a partial first line, a block of whole lines, a partial last line */
inline CoreRangeSet linear_cores(CoreCoord grid, uint32_t first, uint32_t n, bool row_wise) {
    std::vector<CoreRange> out;
    const uint32_t len = (uint32_t)(row_wise ? grid.x : grid.y); /* cores per line */
    auto at = [&](uint32_t line, uint32_t pos) { return row_wise ? CoreCoord{pos, line} : CoreCoord{line, pos}; };
    uint32_t i = first;
    const uint32_t end = first + n;
    while (i < end) {
        const uint32_t line = i / len, pos = i % len;
        if (pos != 0 || end - i < len) { /* a partial line */
            const uint32_t last = std::min(len, pos + (end - i)) - 1;
            out.emplace_back(at(line, pos), at(line, last));
            i += last - pos + 1;
        } else { /* whole lines */
            const uint32_t lines = (end - i) / len;
            out.emplace_back(at(line, 0), at(line + lines - 1, len - 1));
            i += lines * len;
        }
    }
    return CoreRangeSet(out);
}
}  // namespace detail

/* returns {num_cores, all_cores, core_group_1, core_group_2, units_per_core_group_1, units_per_core_group_2} */
inline std::tuple<uint32_t, CoreRangeSet, CoreRangeSet, CoreRangeSet, uint32_t, uint32_t> split_work_to_cores(
    const CoreCoord grid_size, const uint32_t units_to_divide, const bool row_wise = false) {
    if (units_to_divide == 0) return {0, CoreRangeSet(), CoreRangeSet(), CoreRangeSet(), 0, 0};
    const uint32_t max_cores = (uint32_t)(grid_size.x * grid_size.y);
    if (max_cores == 0) ttmodel::fail(0, "model", "split_work_to_cores: an empty grid %zux%zu", grid_size.x, grid_size.y);
    const uint32_t n = std::min(units_to_divide, max_cores);
    const uint32_t floor_units = units_to_divide / n, more = units_to_divide % n;
    CoreRangeSet all = detail::linear_cores(grid_size, 0, n, row_wise);
    if (more == 0) return {n, all, all, CoreRangeSet(), floor_units, 0};
    return {n, all, detail::linear_cores(grid_size, 0, more, row_wise), detail::linear_cores(grid_size, more, n - more, row_wise),
            floor_units + 1, floor_units};
}

}  // namespace tt::tt_metal

#endif /* OPGEN_TTMETAL_MODEL_WORK_SPLIT_HPP */
