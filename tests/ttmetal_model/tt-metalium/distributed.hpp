/* tt-metalium/distributed.hpp — opgen's TT-Metal CPU model: the tt::tt_metal::distributed host API subset
 * (0.81.1 spellings; docs/ttmetal_model.md) for one device as a 1x1 mesh, plus the host-side
 * TensorAccessorArgs of tt-metalium/tensor_accessor_args.hpp.
 *
 * A MeshBuffer is an interleaved DRAM buffer in the model's DRAM arena, laid out as the model's kernel-side
 * TensorAccessor reads it: page i at address() + i * aligned page size (the page size rounded up to the DRAM
 * alignment, 32 B on Wormhole, 64 B on Blackhole); no banks. EnqueueMeshWorkload runs the workload's
 * programs one after the other with ttmodel::run; every call is synchronous, so `blocking` and Finish do
 * nothing. Misuse aborts with "ttmetal-model: rule 0 (model): ...". */
#ifndef OPGEN_TTMETAL_MODEL_DISTRIBUTED_HPP
#define OPGEN_TTMETAL_MODEL_DISTRIBUTED_HPP

#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "tt-metalium/host_api.hpp"

namespace tt::tt_metal {

using DeviceAddr = uint64_t;
enum class BufferType { DRAM, L1, SYSTEM_MEMORY, L1_SMALL, TRACE };

namespace distributed {

class MeshShape {
  public:
    MeshShape(uint32_t rows, uint32_t cols) : dims_{rows, cols} {}
    explicit MeshShape(uint32_t n) : dims_{n, 1} {}
    uint32_t operator[](std::size_t i) const { return dims_[i]; }
    std::size_t dims() const { return 2; }
    std::size_t mesh_size() const { return (std::size_t)dims_[0] * dims_[1]; }
    bool operator==(const MeshShape &o) const { return dims_[0] == o.dims_[0] && dims_[1] == o.dims_[1]; }

  private:
    uint32_t dims_[2];
};

class MeshCoordinate {
  public:
    MeshCoordinate(uint32_t r, uint32_t c) : r_(r), c_(c) {}
    uint32_t operator[](std::size_t i) const { return i == 0 ? r_ : c_; }

  private:
    uint32_t r_, c_;
};

class MeshCoordinateRange {
  public:
    explicit MeshCoordinateRange(const MeshShape &shape) : shape_(shape) {}
    const MeshShape &shape() const { return shape_; }

  private:
    MeshShape shape_;
};

class MeshDevice;

class MeshCommandQueue {
  public:
    explicit MeshCommandQueue(MeshDevice *d) : device_(d) {}
    MeshCommandQueue(const MeshCommandQueue &) = delete;
    MeshCommandQueue &operator=(const MeshCommandQueue &) = delete;
    MeshDevice *device() const { return device_; }

  private:
    MeshDevice *device_;
};

/* one device, as tt-metal's create_unit_mesh makes it: a 1x1 mesh */
class MeshDevice : public std::enable_shared_from_this<MeshDevice> {
  public:
    static std::shared_ptr<MeshDevice> create_unit_mesh(int device_id, std::size_t l1_small_size = 0,
                                                        std::size_t trace_region_size = 0, std::size_t num_command_queues = 1) {
        (void)l1_small_size, (void)trace_region_size;
        if (device_id != 0) ttmodel::fail(0, "model", "create_unit_mesh(%d): the model has one device, id 0", device_id);
        if (num_command_queues != 1) ttmodel::fail(0, "model", "create_unit_mesh: the model has one command queue");
        return std::shared_ptr<MeshDevice>(new MeshDevice());
    }
    MeshCommandQueue &mesh_command_queue(std::optional<uint8_t> cq_id = std::nullopt) const {
        if (cq_id && *cq_id != 0) ttmodel::fail(0, "model", "mesh_command_queue(%u): the model has command queue 0 only", *cq_id);
        return *cq_;
    }
    /* the worker grid: 8x8 (Wormhole n150), or OPGEN_TT_GRID="<x>x<y>" */
    CoreCoord compute_with_storage_grid_size() const { return grid_; }
    MeshShape shape() const { return MeshShape(1, 1); }
    std::size_t num_devices() const { return 1; }
    std::size_t num_rows() const { return 1; }
    std::size_t num_cols() const { return 1; }
    int id() const { return 0; }
    bool close() { return true; }

  private:
    MeshDevice() : cq_(std::make_unique<MeshCommandQueue>(this)), grid_{8, 8} {
        if (const char *g = getenv("OPGEN_TT_GRID"); g && *g) {
            unsigned x = 0, y = 0;
            char tail = 0;
            if (sscanf(g, "%ux%u%c", &x, &y, &tail) != 2 || x == 0 || y == 0)
                ttmodel::fail(0, "model", "OPGEN_TT_GRID=%s: expected <x>x<y>, e.g. 4x2", g);
            grid_ = CoreCoord{x, y};
        }
    }
    std::unique_ptr<MeshCommandQueue> cq_;
    CoreCoord grid_;
};

/* how a buffer lies on one device: interleaved pages of page_size bytes, in DRAM (L1 is not modelled) */
struct DeviceLocalBufferConfig {
    DeviceAddr page_size = 0;
    BufferType buffer_type = BufferType::DRAM;
    std::optional<bool> bottom_up;
};
/* the same buffer of `size` bytes on every device of the mesh */
struct ReplicatedBufferConfig {
    DeviceAddr size = 0;
};

class MeshBuffer {
  public:
    static std::shared_ptr<MeshBuffer> create(const ReplicatedBufferConfig &config, const DeviceLocalBufferConfig &local,
                                              MeshDevice *mesh_device, std::optional<DeviceAddr> address = std::nullopt) {
        if (!mesh_device) ttmodel::fail(0, "model", "MeshBuffer::create: no MeshDevice");
        if (address) ttmodel::fail(0, "model", "MeshBuffer::create at a given address is not modelled");
        if (local.buffer_type != BufferType::DRAM)
            ttmodel::fail(0, "model", "MeshBuffer::create: only BufferType::DRAM (interleaved) buffers are modelled");
        if (local.page_size == 0 || config.size == 0 || config.size % local.page_size != 0)
            ttmodel::fail(0, "model", "MeshBuffer::create: size %llu B is not a positive multiple of the page size %llu B",
                          (unsigned long long)config.size, (unsigned long long)local.page_size);
        const uint32_t align = ttmodel::dram_read_align();
        const uint64_t aligned = (local.page_size + align - 1) / align * align, pages = config.size / local.page_size;
        if (pages * aligned > 0xffffffffull) ttmodel::fail(0, "model", "MeshBuffer::create: %llu B is too large", (unsigned long long)(pages * aligned));
        auto b = std::shared_ptr<MeshBuffer>(new MeshBuffer());
        b->device_ = mesh_device;
        b->local_ = local;
        b->size_ = config.size;
        b->aligned_page_ = (uint32_t)aligned;
        b->addr_ = ttmodel::dram_alloc((uint32_t)(pages * aligned));
        return b;
    }
    MeshBuffer(const MeshBuffer &) = delete;
    MeshBuffer &operator=(const MeshBuffer &) = delete;

    MeshDevice *device() const { return device_; }
    DeviceAddr address() const { return addr_; }
    DeviceAddr size() const { return size_; }
    DeviceAddr device_local_size() const { return size_; }
    uint32_t page_size() const { return (uint32_t)local_.page_size; }
    uint32_t num_pages() const { return (uint32_t)(size_ / local_.page_size); }
    const DeviceLocalBufferConfig &device_local_config() const { return local_; }
    bool is_allocated() const { return true; }
    /* model only: the page size rounded up to the DRAM alignment (the distance between pages) */
    uint32_t aligned_page_size() const { return aligned_page_; }

  private:
    MeshBuffer() = default;
    MeshDevice *device_ = nullptr;
    DeviceLocalBufferConfig local_;
    DeviceAddr size_ = 0;
    uint32_t addr_ = 0, aligned_page_ = 0;
};

class MeshWorkload {
  public:
    void add_program(const MeshCoordinateRange &device_range, Program &&program) {
        if (device_range.shape().mesh_size() != 1)
            ttmodel::fail(0, "model", "MeshWorkload::add_program: the model's mesh is 1x1");
        programs_.push_back(std::move(program));
    }
    std::vector<Program> &programs() { return programs_; }

  private:
    std::vector<Program> programs_;
};
inline MeshWorkload CreateMeshWorkload() { return MeshWorkload(); }
inline void AddProgramToMeshWorkload(MeshWorkload &workload, Program &&program, const MeshCoordinateRange &device_range) {
    workload.add_program(device_range, std::move(program));
}

/* runs the workload's programs in order on the model; every core a kernel names must lie in the grid */
inline void EnqueueMeshWorkload(MeshCommandQueue &mesh_cq, MeshWorkload &mesh_workload, bool blocking) {
    (void)blocking;
    const CoreCoord grid = mesh_cq.device()->compute_with_storage_grid_size();
    for (auto &program : mesh_workload.programs()) {
        for (const auto &k : program.kernels)
            for (const auto &c : k.cores)
                if (c.x >= grid.x || c.y >= grid.y)
                    ttmodel::fail(0, "model", "EnqueueMeshWorkload: kernel %s runs on core (%zu,%zu), outside the %zux%zu worker grid",
                                  k.path.c_str(), c.x, c.y, grid.x, grid.y);
        ttmodel::run(program);
    }
}

/* host -> buffer: `src` holds the buffer's pages densely (page_size bytes each); they land at the aligned pages */
template <typename DType>
void EnqueueWriteMeshBuffer(MeshCommandQueue &mesh_cq, std::shared_ptr<MeshBuffer> &mesh_buffer, const std::vector<DType> &src,
                            bool blocking = false) {
    static_assert(std::is_trivially_copyable_v<DType>, "EnqueueWriteMeshBuffer: the element type must be trivially copyable");
    (void)mesh_cq, (void)blocking;
    if (!mesh_buffer) ttmodel::fail(0, "model", "EnqueueWriteMeshBuffer: null MeshBuffer");
    const uint64_t bytes = (uint64_t)src.size() * sizeof(DType);
    if (bytes != mesh_buffer->size())
        ttmodel::fail(0, "model", "EnqueueWriteMeshBuffer: %zu elements of %zu B = %llu B of host data for a MeshBuffer of %llu B",
                      src.size(), sizeof(DType), (unsigned long long)bytes, (unsigned long long)mesh_buffer->size());
    const uint32_t page = mesh_buffer->page_size(), aligned = mesh_buffer->aligned_page_size();
    const uint8_t *p = reinterpret_cast<const uint8_t *>(src.data());
    for (uint32_t i = 0; i < mesh_buffer->num_pages(); i++)
        memcpy(ttmodel::dram_ptr((uint32_t)mesh_buffer->address() + i * aligned), p + (uint64_t)i * page, page);
}
/* buffer -> host: resizes `dst` to the buffer's size and fills it with the pages, densely */
template <typename DType>
void EnqueueReadMeshBuffer(MeshCommandQueue &mesh_cq, std::vector<DType> &dst, std::shared_ptr<MeshBuffer> &mesh_buffer,
                           bool blocking = true) {
    static_assert(std::is_trivially_copyable_v<DType>, "EnqueueReadMeshBuffer: the element type must be trivially copyable");
    (void)mesh_cq, (void)blocking;
    if (!mesh_buffer) ttmodel::fail(0, "model", "EnqueueReadMeshBuffer: null MeshBuffer");
    if (mesh_buffer->size() % sizeof(DType))
        ttmodel::fail(0, "model", "EnqueueReadMeshBuffer: a MeshBuffer of %llu B is not a whole number of %zu-B elements",
                      (unsigned long long)mesh_buffer->size(), sizeof(DType));
    dst.resize(mesh_buffer->size() / sizeof(DType));
    const uint32_t page = mesh_buffer->page_size(), aligned = mesh_buffer->aligned_page_size();
    uint8_t *p = reinterpret_cast<uint8_t *>(dst.data());
    for (uint32_t i = 0; i < mesh_buffer->num_pages(); i++)
        memcpy(p + (uint64_t)i * page, ttmodel::dram_ptr((uint32_t)mesh_buffer->address() + i * aligned), page);
}
inline void Finish(MeshCommandQueue &mesh_cq) { (void)mesh_cq; }

}  // namespace distributed

/* host side of TensorAccessorArgs (tt-metalium/tensor_accessor_args.hpp): for an interleaved DRAM buffer the
 * kernel's TensorAccessorArgs<N> reads 2 compile-time args, {config bits = 2 (IsDram), aligned page size} */
class TensorAccessorArgs {
  public:
    explicit TensorAccessorArgs(const distributed::MeshBuffer &buffer) : buffer_(&buffer) {}
    explicit TensorAccessorArgs(const distributed::MeshBuffer *buffer) : buffer_(buffer) {
        if (!buffer) ttmodel::fail(0, "model", "TensorAccessorArgs(nullptr) is not modelled");
    }
    explicit TensorAccessorArgs(const std::shared_ptr<distributed::MeshBuffer> &buffer) : TensorAccessorArgs(buffer.get()) {}
    void append_to(std::vector<uint32_t> &compile_time_args) const {
        compile_time_args.push_back(2u);
        compile_time_args.push_back(buffer_->aligned_page_size());
    }
    std::vector<uint32_t> get_compile_time_args() const {
        std::vector<uint32_t> v;
        append_to(v);
        return v;
    }

  private:
    const distributed::MeshBuffer *buffer_;
};

}  // namespace tt::tt_metal

#endif /* OPGEN_TTMETAL_MODEL_DISTRIBUTED_HPP */
