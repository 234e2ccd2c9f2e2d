/* A C producer and a C consumer, to prove tensors cross the boundary both ways
 * and that each deleter runs exactly once. */
#include <stdlib.h>
#include <dlpack/dlpack.h>

static int c_deleted = 0;

int dlb_c_deleted_count(void) { return c_deleted; }

typedef struct {
  DLManagedTensorVersioned managed;
  int64_t shape[2];
  int64_t strides[2];
  float data[];
} c_block;

static void c_delete(DLManagedTensorVersioned* self) {
  c_deleted += 1;
  free(self->manager_ctx);
}

/* A rows x cols float32 tensor holding 0, 1, 2, ...; transposed if asked, so
 * that the consumer sees column-major strides. */
DLManagedTensorVersioned* dlb_c_make_tensor(int64_t rows, int64_t cols, int transposed) {
  c_block* b = malloc(sizeof(c_block) + sizeof(float) * (size_t)(rows * cols));
  if (!b) return NULL;
  for (int64_t i = 0; i < rows * cols; ++i) b->data[i] = (float)i;
  b->managed.version.major = DLPACK_MAJOR_VERSION;
  b->managed.version.minor = DLPACK_MINOR_VERSION;
  b->managed.manager_ctx = b;
  b->managed.deleter = c_delete;
  b->managed.flags = 0;
  DLTensor* t = &b->managed.dl_tensor;
  t->data = b->data;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->ndim = 2;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  if (transposed) {
    b->shape[0] = cols; b->shape[1] = rows; b->strides[0] = 1; b->strides[1] = cols;
  } else {
    b->shape[0] = rows; b->shape[1] = cols; b->strides[0] = cols; b->strides[1] = 1;
  }
  t->shape = b->shape;
  t->strides = b->strides;
  t->byte_offset = 0;
  return &b->managed;
}

/* Sums a 1-d or 2-d float32 tensor through its strides, then deletes it as any
 * consumer must. Returns -1 for a tensor it cannot read. */
double dlb_c_consume_sum(DLManagedTensorVersioned* m) {
  double sum = -1;
  const DLTensor* t = &m->dl_tensor;
  if (m->version.major == DLPACK_MAJOR_VERSION && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
      t->ndim >= 1 && t->ndim <= 2 && t->strides != NULL) {
    const float* base = (const float*)((const char*)t->data + t->byte_offset);
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1;
    int64_t cols = t->shape[t->ndim - 1];
    int64_t rs = t->ndim == 2 ? t->strides[0] : 0;
    int64_t cs = t->strides[t->ndim - 1];
    sum = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) sum += base[r * rs + c * cs];
  }
  if (m->deleter) m->deleter(m);
  return sum;
}
