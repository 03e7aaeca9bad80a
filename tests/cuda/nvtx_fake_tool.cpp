// A fake NVTX tool for the NVTX tests: loaded by NVTX itself through NVTX_INJECTION64_PATH (the
// mechanism Nsight Systems and Compute Sanitizer use), it attaches to the core, domain and
// memory-extension entry points the public NVTX headers define and logs every call as one line
// of text, which the test reads back through tp_fake_nvtx_log().
#define NVTX_NO_IMPL  // a tool: the types and callback ids only, not NVTX's own implementation
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>

namespace {

std::mutex log_mutex;
std::string log_text;

void log_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(log_mutex);
  log_text += line;
  log_text += '\n';
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

/// Registered strings are handed out as pointers to their own copies.
const char* text_of(const nvtxEventAttributes_t* a) {
  if (a == nullptr) return "?";
  if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) return reinterpret_cast<const char*>(a->message.registered);
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) return a->message.ascii;
  return "?";
}

std::string payload_of(const nvtxEventAttributes_t* a) {
  return a != nullptr && a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 ? std::to_string(a->payload.ullValue) : "-";
}

// --- core and domain entry points ------------------------------------------------------------

/// Domain names and registered strings, kept for the life of the process like the handles that
/// point into them (a deque never moves its elements).
const std::string& kept(const char* s) {
  static std::deque<std::string> strings;
  std::lock_guard<std::mutex> lock(log_mutex);
  return strings.emplace_back(s);
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  log_line(std::string("domain ") + name);
  return reinterpret_cast<nvtxDomainHandle_t>(const_cast<std::string*>(&kept(name)));
}
nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t, const char* s) {
  return reinterpret_cast<nvtxStringHandle_t>(const_cast<char*>(kept(s).c_str()));
}
void NVTX_API mark(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) {
  log_line(std::string("mark ") + text_of(a) + " " + payload_of(a));
}
int NVTX_API push(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) {
  log_line(std::string("push ") + text_of(a) + " " + payload_of(a));
  return 0;
}
int NVTX_API pop(nvtxDomainHandle_t) {
  log_line("pop");
  return 0;
}

// --- memory extension ------------------------------------------------------------------------

nvtxMemHeapHandle_t NVTX_API heap_register(nvtxDomainHandle_t, const nvtxMemHeapDesc_t* d) {
  const auto* range = static_cast<const nvtxMemVirtualRangeDesc_t*>(d->typeSpecificDesc);
  log_line("heap+ " + hex(range->ptr) + " " + std::to_string(range->size) +
           (d->usage == NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR ? " suballocator" : " other"));
  return reinterpret_cast<nvtxMemHeapHandle_t>(const_cast<void*>(range->ptr));  // the address
}
void NVTX_API heap_unregister(nvtxDomainHandle_t, nvtxMemHeapHandle_t heap) { log_line("heap- " + hex(heap)); }
void NVTX_API regions_register(nvtxDomainHandle_t, const nvtxMemRegionsRegisterBatch_t* b) {
  const auto* r = static_cast<const nvtxMemVirtualRangeDesc_t*>(b->regionDescElements);
  for (std::size_t i = 0; i < b->regionCount; ++i)
    log_line("region+ " + hex(r[i].ptr) + " " + std::to_string(r[i].size) + " in " + hex(b->heap));
}
void NVTX_API regions_unregister(nvtxDomainHandle_t, const nvtxMemRegionsUnregisterBatch_t* b) {
  for (std::size_t i = 0; i < b->refCount; ++i) log_line("region- " + hex(b->refElements[i].pointer));
}

template <class F>
void set(NvtxFunctionTable table, unsigned size, unsigned id, F fn) {
  if (id < size) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0) return 0;
  set(table, size, NVTX_CBID_CORE2_DomainCreateA, domain_create);
  set(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, register_string);
  set(table, size, NVTX_CBID_CORE2_DomainMarkEx, mark);
  set(table, size, NVTX_CBID_CORE2_DomainRangePushEx, push);
  set(table, size, NVTX_CBID_CORE2_DomainRangePop, pop);
  log_line("attached");
  return 1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t* info) {
  if (info == nullptr || info->moduleId != NVTX_EXT_MODULEID_MEM || info->segmentsCount < 1) return 1;
  intptr_t* slots = info->segments[0].functionSlots;
  const std::size_t n = info->segments[0].slotCount;
  const auto put = [&](std::size_t id, auto fn) {
    if (id < n) slots[id] = reinterpret_cast<intptr_t>(fn);
  };
  put(NVTX3EXT_CBID_nvtxMemHeapRegister, heap_register);
  put(NVTX3EXT_CBID_nvtxMemHeapUnregister, heap_unregister);
  put(NVTX3EXT_CBID_nvtxMemRegionsRegister, regions_register);
  put(NVTX3EXT_CBID_nvtxMemRegionsUnregister, regions_unregister);
  log_line("attached mem");
  return 1;
}

/// The calls so far, one per line; clears the log if `clear`.
__attribute__((visibility("default"))) const char* tp_fake_nvtx_log(int clear) {
  static std::string copy;
  std::lock_guard<std::mutex> lock(log_mutex);
  copy = log_text;
  if (clear != 0) log_text.clear();
  return copy.c_str();
}

}  // extern "C"
