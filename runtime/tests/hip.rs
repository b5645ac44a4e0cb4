//! HipRuntime without an AMD GPU.
//!
//! Three kinds of tests:
//! - fake HIP libraries: a small C shared object built here with `cc`, exporting chosen hip*
//!   (and hiprtc*) symbols with checkable behaviour, loaded through `HipLoadOptions` (or
//!   `QUANTSHADOW_HIP_LIB` in a child process). They check the symbol table, the status ->
//!   error mapping, the device-properties layouts and that every argument reaches the C side
//!   in the right place with the right constant;
//! - the real libamdhip64 when it is installed (Debian's libamdhip64-5 here): loads, reports
//!   NoDevice without a GPU, compiles with its hipRTC;
//! - the real libamdhip64 when it is not installed: LibraryMissing naming what was searched.
//!
//! Which of the last two runs is decided by looking for the library independently.

use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use quantshadow_runtime::device::gpu::ResultRing;
use quantshadow_runtime::device::hip::{HipLoadOptions, HipRuntime};
use quantshadow_runtime::device::{
    DeviceError, Event, Function, GpuRuntime, LaunchOrder, Module, Stream, Vendor,
};

// ---------------------------------------------------------------------------------------------
// The fake HIP library.

/// One C source, several variants chosen with -D flags. Struct layouts are transcribed from
/// the headers (hipDeviceProp_t of ROCm 5.2.3 = R0000; hipDeviceProp_tR0600 of ROCm 6.x/7.x)
/// and filled by field name, so gcc computes the offsets independently of the Rust side.
const FAKE_HIP_C: &str = r##"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned bits; } hipDeviceArch_t;

typedef struct {
  char name[256]; size_t totalGlobalMem; size_t sharedMemPerBlock; int regsPerBlock; int warpSize;
  int maxThreadsPerBlock; int maxThreadsDim[3]; int maxGridSize[3]; int clockRate; int memoryClockRate;
  int memoryBusWidth; size_t totalConstMem; int major; int minor; int multiProcessorCount; int l2CacheSize;
  int maxThreadsPerMultiProcessor; int computeMode; int clockInstructionRate; hipDeviceArch_t arch;
  int concurrentKernels; int pciDomainID; int pciBusID; int pciDeviceID; size_t maxSharedMemoryPerMultiProcessor;
  int isMultiGpuBoard; int canMapHostMemory; int gcnArch; char gcnArchName[256]; int integrated;
  int cooperativeLaunch; int cooperativeMultiDeviceLaunch; int maxTexture1DLinear; int maxTexture1D;
  int maxTexture2D[2]; int maxTexture3D[3]; unsigned int* hdpMemFlushCntl; unsigned int* hdpRegFlushCntl;
  size_t memPitch; size_t textureAlignment; size_t texturePitchAlignment; int kernelExecTimeoutEnabled;
  int ECCEnabled; int tccDriver; int cooperativeMultiDeviceUnmatchedFunc; int cooperativeMultiDeviceUnmatchedGridDim;
  int cooperativeMultiDeviceUnmatchedBlockDim; int cooperativeMultiDeviceUnmatchedSharedMem; int isLargeBar;
  int asicRevision; int managedMemory; int directManagedMemAccessFromHost; int concurrentManagedAccess;
  int pageableMemoryAccess; int pageableMemoryAccessUsesHostPageTables;
} hipDeviceProp_tR0000;

typedef struct {
  char name[256]; char uuid[16]; char luid[8]; unsigned int luidDeviceNodeMask; size_t totalGlobalMem;
  size_t sharedMemPerBlock; int regsPerBlock; int warpSize; size_t memPitch; int maxThreadsPerBlock;
  int maxThreadsDim[3]; int maxGridSize[3]; int clockRate; size_t totalConstMem; int major; int minor;
  size_t textureAlignment; size_t texturePitchAlignment; int deviceOverlap; int multiProcessorCount;
  int kernelExecTimeoutEnabled; int integrated; int canMapHostMemory; int computeMode; int maxTexture1D;
  int maxTexture1DMipmap; int maxTexture1DLinear; int maxTexture2D[2]; int maxTexture2DMipmap[2];
  int maxTexture2DLinear[3]; int maxTexture2DGather[2]; int maxTexture3D[3]; int maxTexture3DAlt[3];
  int maxTextureCubemap; int maxTexture1DLayered[2]; int maxTexture2DLayered[3]; int maxTextureCubemapLayered[2];
  int maxSurface1D; int maxSurface2D[2]; int maxSurface3D[3]; int maxSurface1DLayered[2]; int maxSurface2DLayered[3];
  int maxSurfaceCubemap; int maxSurfaceCubemapLayered[2]; size_t surfaceAlignment; int concurrentKernels;
  int ECCEnabled; int pciBusID; int pciDeviceID; int pciDomainID; int tccDriver; int asyncEngineCount;
  int unifiedAddressing; int memoryClockRate; int memoryBusWidth; int l2CacheSize; int persistingL2CacheMaxSize;
  int maxThreadsPerMultiProcessor; int streamPrioritiesSupported; int globalL1CacheSupported;
  int localL1CacheSupported; size_t sharedMemPerMultiprocessor; int regsPerMultiprocessor; int managedMemory;
  int isMultiGpuBoard; int multiGpuBoardGroupID; int hostNativeAtomicSupported; int singleToDoublePrecisionPerfRatio;
  int pageableMemoryAccess; int concurrentManagedAccess; int computePreemptionSupported;
  int canUseHostPointerForRegisteredMem; int cooperativeLaunch; int cooperativeMultiDeviceLaunch;
  size_t sharedMemPerBlockOptin; int pageableMemoryAccessUsesHostPageTables; int directManagedMemAccessFromHost;
  int maxBlocksPerMultiProcessor; int accessPolicyMaxWindowSize; size_t reservedSharedMemPerBlock;
  int hostRegisterSupported; int sparseHipArraySupported; int hostRegisterReadOnlySupported;
  int timelineSemaphoreInteropSupported; int memoryPoolsSupported; int gpuDirectRDMASupported;
  unsigned int gpuDirectRDMAFlushWritesOptions; int gpuDirectRDMAWritesOrdering;
  unsigned int memoryPoolSupportedHandleTypes; int deferredMappingHipArraySupported; int ipcEventSupported;
  int clusterLaunch; int unifiedFunctionPointers; int reserved[63]; int hipReserved[32]; char gcnArchName[256];
  size_t maxSharedMemoryPerMultiProcessor; int clockInstructionRate; hipDeviceArch_t arch;
  unsigned int* hdpMemFlushCntl; unsigned int* hdpRegFlushCntl; int cooperativeMultiDeviceUnmatchedFunc;
  int cooperativeMultiDeviceUnmatchedGridDim; int cooperativeMultiDeviceUnmatchedBlockDim;
  int cooperativeMultiDeviceUnmatchedSharedMem; int isLargeBar; int asicRevision;
} hipDeviceProp_tR0600;

_Static_assert(sizeof(hipDeviceProp_tR0600) == 1472, "R0600 size (hipcc on ROCm 6 reports 1472)");
_Static_assert(sizeof(hipDeviceProp_tR0000) == 792, "R0000 size (gcc on ROCm 5.2.3's header: 792)");

#define CURRENT 1 /* the fake's current device ordinal: not 0, so a hard-coded 0 shows up */

int hipRuntimeGetVersion(int* v) { *v = FAKE_VERSION; return 0; }

int hipGetDeviceCount(int* n) {
  *n = FAKE_DEVICES;
  return FAKE_DEVICES == 0 ? 100 /* hipErrorNoDevice */ : 0;
}

int hipMalloc(void** p, size_t n) {
#ifdef HAVE_FULL
  if (n > ((size_t)1 << 40)) return 2; /* hipErrorOutOfMemory */
  *p = calloc(1, n ? n : 1);
  return *p ? 0 : 2;
#else
  (void)p; (void)n;
  return 2;
#endif
}

#ifdef HAVE_ERROR_TEXT
const char* hipGetErrorName(int e) {
  switch (e) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 21: return "hipErrorInvalidMemcpyDirection";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 400: return "hipErrorInvalidHandle";
    case 500: return "hipErrorNotFound";
    case 713: return "hipErrorHostMemoryNotRegistered";
    default: return "hipErrorUnknown";
  }
}
const char* hipGetErrorString(int e) {
  switch (e) {
    case 2: return "fake: out of memory";
    case 500: return "fake: named symbol not found";
    default: return hipGetErrorName(e);
  }
}
#endif

#ifdef HAVE_FULL
int hipGetDevice(int* d) { *d = CURRENT; return 0; }
int hipDeviceGetName(char* name, int len, int dev) {
  if (dev != CURRENT) return 101;
  snprintf(name, (size_t)len, "%s", FAKE_NAME);
  return 0;
}
int hipDeviceTotalMem(size_t* bytes, int dev) {
  if (dev != CURRENT) return 101;
  *bytes = (size_t)192 << 30;
  return 0;
}
int hipDeviceGetAttribute(int* v, int attr, int dev) {
  if (dev != CURRENT) return 101;
  switch (attr) {
    case 63: *v = FAKE_CUS; return 0; /* hipDeviceAttributeMultiprocessorCount */
    case 87: *v = 64; return 0;       /* hipDeviceAttributeWarpSize */
    default: return 1;
  }
}
/* ROCm 6 and later export both: the legacy name keeps the R0000 layout. Its arch is a decoy. */
int hipGetDeviceProperties(hipDeviceProp_tR0000* p, int dev) {
  if (dev != CURRENT) return 101;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", FAKE_NAME);
  snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", FAKE_R0000_ARCH);
  return 0;
}
#ifdef HAVE_R0600
int hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* p, int dev) {
  if (dev != CURRENT) return 101;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", FAKE_NAME);
  snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", "gfx942:sramecc+:xnack-");
  return 0;
}
#endif

int hipFree(void* p) { free(p); return 0; }

/* Registered host memory. hipHostRegister takes only hipHostRegisterMapped (2) on whole,
   page-aligned pages that are still zero (fresh anonymous pages), and remembers the range; only
   a registered pointer has a device address, and unregistering an unknown one is
   hipErrorHostMemoryNotRegistered (713), as after a hipDeviceReset. A thread arms failures for
   its own next calls with fake_fail_host (1: register, 2: device pointer, 4: unregister) and
   reads back what it last tried to register and how many ranges it has registered now. */
#define MAX_REGISTERED 256
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t ptr; size_t n; } g_registered[MAX_REGISTERED];
static __thread int g_fail_host;
static __thread uintptr_t g_register_attempt;
static __thread size_t g_register_attempt_bytes;
static __thread int g_registered_by_thread;
void fake_fail_host(int which) { g_fail_host = which; }
uintptr_t fake_register_attempt(void) { return g_register_attempt; }
size_t fake_register_attempt_bytes(void) { return g_register_attempt_bytes; }
int fake_registered_by_thread(void) { return g_registered_by_thread; }
static int take_failure(int which) {
  if (!(g_fail_host & which)) return 0;
  g_fail_host &= ~which;
  return 1;
}
static int find_registered(uintptr_t p) {
  for (int k = 0; k < MAX_REGISTERED; k++) if (g_registered[k].ptr == p) return k;
  return -1;
}
int hipHostRegister(void* p, size_t n, unsigned flags) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  g_register_attempt = (uintptr_t)p;
  g_register_attempt_bytes = n;
  if (flags != 2u) return 1;
  if (p == NULL || n == 0 || (uintptr_t)p % page != 0 || n % page != 0) return 1;
  for (size_t k = 0; k < n; k++) if (((const unsigned char*)p)[k] != 0) return 1;
  if (take_failure(1)) return 2; /* hipErrorOutOfMemory */
  pthread_mutex_lock(&g_reg_lock);
  int status = 712; /* hipErrorHostMemoryAlreadyRegistered */
  if (find_registered((uintptr_t)p) < 0) {
    int slot = find_registered(0);
    if (slot >= 0) {
      g_registered[slot].ptr = (uintptr_t)p;
      g_registered[slot].n = n;
      g_registered_by_thread++;
      status = 0;
    } else {
      status = 2;
    }
  }
  pthread_mutex_unlock(&g_reg_lock);
  return status;
}
int hipHostGetDevicePointer(void** d, void* h, unsigned flags) {
  if (flags != 0 || h == NULL) return 1;
  if (take_failure(2)) return 1;
  pthread_mutex_lock(&g_reg_lock);
  int known = find_registered((uintptr_t)h) >= 0;
  pthread_mutex_unlock(&g_reg_lock);
  if (!known) return 1;
  *d = (void*)((uintptr_t)h ^ ((uintptr_t)1 << 62));
  return 0;
}
#ifndef NO_HOST_UNREGISTER
int hipHostUnregister(void* p) {
  if (p == NULL) return 1;
  if (take_failure(4)) return 713;
  pthread_mutex_lock(&g_reg_lock);
  int slot = find_registered((uintptr_t)p);
  if (slot >= 0) {
    g_registered[slot].ptr = 0;
    g_registered_by_thread--;
  }
  pthread_mutex_unlock(&g_reg_lock);
  return slot >= 0 ? 0 : 713;
}
#endif

/* "Device" memory is host memory from hipMalloc above. Host-to-device copies are counted by
   the stream they take: the null stream (synchronous call) or the last async one's handle. */
static int g_htod_null_stream = 0;
static uintptr_t g_htod_last_stream = 0;
int fake_htod_null_stream_copies(void) { return g_htod_null_stream; }
uintptr_t fake_htod_last_stream(void) { return g_htod_last_stream; }
int hipMemcpyHtoD(void* dst, const void* src, size_t n) { g_htod_null_stream++; memcpy(dst, src, n); return 0; }
int hipMemcpyDtoH(void* dst, void* src, size_t n) { memcpy(dst, src, n); return 0; }
/* A host-to-device copy on a stream lands only when this thread synchronises that stream (as
   a real one may run later): a caller that does not wait never sees its data arrive. */
static __thread struct { void* dst; const void* src; size_t n; void* stream; } g_pending_htod;
int hipMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  if (kind == 1) { /* hipMemcpyHostToDevice */
    if (g_pending_htod.dst) return 1; /* one at a time is all a synchronous copy needs */
    g_htod_last_stream = (uintptr_t)stream;
    g_pending_htod.dst = dst; g_pending_htod.src = src; g_pending_htod.n = n; g_pending_htod.stream = stream;
    return 0;
  }
  if (kind != 3) return 21; /* otherwise only hipMemcpyDeviceToDevice is expected */
  memcpy(dst, src, n);
  return 0;
}
int hipMemsetD8Async(void* dst, unsigned char v, size_t n, void* stream) {
  (void)stream;
  memset(dst, v, n);
  return 0;
}

int hipModuleLoadData(void** m, const void* image) {
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return 200; /* hipErrorInvalidImage */
  *m = (void*)0x9000;
  return 0;
}
int hipModuleGetFunction(void** f, void* m, const char* name) {
  if (m != (void*)0x9000) return 400;
  if (strcmp(name, "kernel_a") != 0) return 500;
  *f = (void*)0x9100;
  return 0;
}
/* kernel_a(unsigned* out) writes its launch configuration to out[0..8]. */
int hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  if (f != (void*)0x9100) return 400;
  if (extra != NULL || params == NULL) return 1;
  unsigned* out = *(unsigned**)params[0];
  unsigned values[8] = {gx, gy, gz, bx, by, bz, shared, (unsigned)(uintptr_t)stream};
  memcpy(out, values, sizeof values);
  return 0;
}

/* The capture status is the stream handle's value, so a test picks it by picking the stream. */
int hipStreamIsCapturing(void* stream, int* status) {
  if ((uintptr_t)stream > 0xff) return 400;
  *status = (int)(uintptr_t)stream;
  return 0;
}
int hipStreamSynchronize(void* stream) {
  if ((uintptr_t)stream > 0xffff) return 400;
  if (g_pending_htod.dst && g_pending_htod.stream == stream) {
    memcpy(g_pending_htod.dst, g_pending_htod.src, g_pending_htod.n);
    g_pending_htod.dst = NULL;
  }
  return 0;
}
int hipDeviceGetStreamPriorityRange(int* least, int* greatest) { *least = 3; *greatest = -4; return 0; }
/* The handle encodes the flags and priority it was created with. */
int hipStreamCreateWithPriority(void** s, unsigned flags, int priority) {
  *s = (void*)(uintptr_t)(0x5000 + flags * 0x100 + (unsigned)(priority + 16));
  return 0;
}
int hipEventCreateWithFlags(void** e, unsigned flags) { *e = (void*)(uintptr_t)(0x7000 + flags); return 0; }
int hipEventRecord(void* e, void* s) { (void)s; return e ? 0 : 400; }
int hipStreamWaitEvent(void* s, void* e, unsigned flags) { (void)s; (void)e; return flags ? 1 : 0; }
/* Events made with flag 1 report "not ready" (600), others complete. */
int hipEventQuery(void* e) { return !e ? 400 : ((uintptr_t)e == 0x7001 ? 600 : 0); }
int hipEventElapsedTime(float* ms, void* start, void* end) {
  if (!start || !end) return 400;
  *ms = (float)((uintptr_t)end - (uintptr_t)start) / 4.0f;
  return 0;
}
#endif /* HAVE_FULL */

#ifdef HAVE_HIPRTC
/* hipRTC inside the HIP library, as in ROCm 5.2. The "code object" is ELF magic followed by
   the options joined with '|', so a test sees exactly what was passed. */
typedef struct { char* source; char log[256]; char* code; size_t code_size; } prog_t;
const char* hiprtcGetErrorString(int r) { return r == 6 ? "HIPRTC_ERROR_COMPILATION" : "HIPRTC_ERROR_OTHER"; }
int hiprtcCreateProgram(void** p, const char* src, const char* name, int n, const char** h, const char** i) {
  (void)name;
  if (n != 0 || h != NULL || i != NULL) return 3;
  prog_t* prog = calloc(1, sizeof *prog);
  prog->source = strdup(src);
  *p = prog;
  return 0;
}
int hiprtcCompileProgram(void* p, int n, const char** options) {
  prog_t* prog = p;
  if (strstr(prog->source, "#error")) {
    snprintf(prog->log, sizeof prog->log, "fake.cu:1:2: error: requested by the test");
    return 6;
  }
  size_t size = 4;
  for (int k = 0; k < n; k++) size += strlen(options[k]) + 1;
  prog->code = calloc(1, size);
  memcpy(prog->code, "\x7f" "ELF", 4);
  size_t at = 4;
  for (int k = 0; k < n; k++) {
    if (k) prog->code[at++] = '|';
    memcpy(prog->code + at, options[k], strlen(options[k]));
    at += strlen(options[k]);
  }
  prog->code_size = at;
  return 0;
}
int hiprtcGetProgramLogSize(void* p, size_t* n) { prog_t* prog = p; *n = prog->log[0] ? strlen(prog->log) + 1 : 0; return 0; }
int hiprtcGetProgramLog(void* p, char* log) { prog_t* prog = p; strcpy(log, prog->log); return 0; }
int hiprtcGetCodeSize(void* p, size_t* n) { prog_t* prog = p; *n = prog->code_size; return 0; }
int hiprtcGetCode(void* p, char* code) { prog_t* prog = p; memcpy(code, prog->code, prog->code_size); return 0; }
int hiprtcDestroyProgram(void** p) {
  prog_t* prog = *p;
  free(prog->source);
  free(prog->code);
  free(prog);
  *p = NULL;
  return 0;
}
#endif
"##;

struct Fakes {
    /// ROCm 6 style: R0600 properties, hipRTC inside, error strings, current device 1 of 2.
    gpu6: PathBuf,
    /// ROCm 5 style: only the legacy (R0000) properties call, no hipRTC.
    gpu5: PathBuf,
    /// Claims ROCm 6.1 but has no hipGetDevicePropertiesR0600: the layout is unknowable.
    odd6: PathBuf,
    /// hipGetDeviceCount says hipErrorNoDevice; hipMalloc always fails; nothing else exported.
    bare: PathBuf,
    /// The ROCm 6 fake without hipHostUnregister.
    no_unregister: PathBuf,
}

fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hip-fakes");
        std::fs::create_dir_all(&dir).expect("create the fake library directory");
        let source = dir.join("fake_hip.c");
        write_atomically(&source, FAKE_HIP_C.as_bytes());
        let common = ["-DFAKE_DEVICES=2", "-DHAVE_FULL", "-DHAVE_ERROR_TEXT", "-DFAKE_CUS=304"];
        let build = |name: &str, flags: &[&str]| -> PathBuf {
            let out = dir.join(format!("libfakehip-{name}.so"));
            let tmp = dir.join(format!("libfakehip-{name}.so.{}.tmp", std::process::id()));
            let status = Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
                .arg(&tmp)
                .arg(&source)
                .args(flags)
                .status()
                .expect("run cc (a C compiler is needed to build the fake HIP library)");
            assert!(status.success(), "cc failed building {name}");
            // Another test process may build the same file at the same time: the rename is
            // atomic and the contents are identical.
            std::fs::rename(&tmp, &out).expect("move the fake library into place");
            out
        };
        let with =
            |extra: &[&'static str]| -> Vec<&'static str> { common.iter().chain(extra).copied().collect() };
        Fakes {
            gpu6: build(
                "gpu6",
                &with(&[
                    "-DFAKE_VERSION=60342134",
                    "-DHAVE_R0600",
                    "-DHAVE_HIPRTC",
                    "-DFAKE_NAME=\"Fake Instinct MI300X\"",
                    "-DFAKE_R0000_ARCH=\"gfx000-decoy\"",
                ]),
            ),
            gpu5: build(
                "gpu5",
                &[
                    "-DFAKE_DEVICES=2",
                    "-DHAVE_FULL",
                    "-DHAVE_ERROR_TEXT",
                    "-DFAKE_CUS=110",
                    "-DFAKE_VERSION=50731921",
                    "-DFAKE_NAME=\"Fake Instinct MI250X\"",
                    "-DFAKE_R0000_ARCH=\"gfx90a:sramecc+:xnack-\"",
                ],
            ),
            odd6: build(
                "odd6",
                &with(&[
                    "-DFAKE_VERSION=60100000",
                    "-DFAKE_NAME=\"Fake odd\"",
                    "-DFAKE_R0000_ARCH=\"gfx942\"",
                ]),
            ),
            bare: build("bare", &["-DFAKE_DEVICES=0", "-DFAKE_VERSION=50200000"]),
            no_unregister: build(
                "no-unregister",
                &with(&[
                    "-DFAKE_VERSION=60342134",
                    "-DHAVE_R0600",
                    "-DNO_HOST_UNREGISTER",
                    "-DFAKE_NAME=\"Fake without hipHostUnregister\"",
                    "-DFAKE_R0000_ARCH=\"gfx942\"",
                ]),
            ),
        }
    })
}

fn write_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).expect("write a temporary file");
    std::fs::rename(&tmp, path).expect("rename a temporary file");
}

fn fake(path: &Path) -> HipRuntime {
    HipRuntime::load_with(&HipLoadOptions { hip_library: Some(path.into()), hiprtc_library: None })
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Fake library: symbol table and error mapping.

#[test]
fn full_fake_resolves_every_symbol_and_bare_fake_reports_what_it_lacks() {
    let gpu6 = fake(&fakes().gpu6);
    assert_eq!(gpu6.missing_symbols(), Vec::<&str>::new(), "the ROCm 6 fake exports the whole table");
    assert!(gpu6.library_path().ends_with("libfakehip-gpu6.so"), "{}", gpu6.library_path());

    let gpu5 = fake(&fakes().gpu5);
    assert_eq!(gpu5.missing_symbols(), vec!["hipGetDevicePropertiesR0600"]);

    let bare = fake(&fakes().bare);
    let exported = ["hipRuntimeGetVersion", "hipGetDeviceCount", "hipMalloc"];
    let expected: Vec<&str> =
        HipRuntime::hip_symbols().iter().copied().filter(|s| !exported.contains(s)).collect();
    assert_eq!(bare.missing_symbols(), expected);
    assert_eq!(HipRuntime::hip_symbols().len(), 31);

    // Mapped host memory is registered, never allocated by HIP.
    for name in ["hipHostRegister", "hipHostGetDevicePointer", "hipHostUnregister"] {
        assert!(HipRuntime::hip_symbols().contains(&name), "{name}");
    }
    for name in ["hipHostMalloc", "hipHostFree"] {
        assert!(!HipRuntime::hip_symbols().contains(&name), "{name}");
    }
    assert_eq!(fake(&fakes().no_unregister).missing_symbols(), vec!["hipHostUnregister"]);
}

#[test]
fn missing_symbol_is_a_typed_error_at_the_call_that_needs_it() {
    let bare = fake(&fakes().bare);
    // SAFETY: hipFree is absent, so nothing is freed; the pointer is never dereferenced.
    let err = unsafe { bare.free(0x1000) }.unwrap_err();
    assert_eq!(err, DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipFree" });
    assert_eq!(
        bare.create_side_stream().unwrap_err(),
        DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipDeviceGetStreamPriorityRange" }
    );
    assert_eq!(
        bare.is_capturing(Stream(0)).unwrap_err(),
        DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipStreamIsCapturing" }
    );
}

#[test]
fn status_maps_to_call_error_with_the_library_text() {
    let gpu6 = fake(&fakes().gpu6);
    assert_eq!(
        gpu6.malloc(1 << 41).unwrap_err(),
        DeviceError::Call {
            call: "hipMalloc",
            code: 2,
            message: "hipErrorOutOfMemory: fake: out of memory".into()
        }
    );
    // Name and string equal (as ROCm 5.2 returns them): said once.
    assert_eq!(
        gpu6.record_event(Event(0), Stream(0)).unwrap_err(),
        DeviceError::Call { call: "hipEventRecord", code: 400, message: "hipErrorInvalidHandle".into() }
    );
    // Without hipGetErrorName/hipGetErrorString the code still comes through.
    let bare = fake(&fakes().bare);
    match bare.malloc(16).unwrap_err() {
        DeviceError::Call { call: "hipMalloc", code: 2, message } => {
            assert!(message.contains("no error text"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_device_status_is_no_device() {
    let bare = fake(&fakes().bare);
    match bare.current_device().unwrap_err() {
        DeviceError::NoDevice { vendor: "AMD", detail } => {
            assert!(detail.contains("hipGetDeviceCount") && detail.contains("100"), "{detail}");
            assert!(detail.contains("libfakehip-bare.so"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Fake library: device information and the two property layouts.

#[test]
fn rocm6_device_info_reads_the_r0600_layout() {
    let info = fake(&fakes().gpu6).current_device().expect("device info");
    assert_eq!(info.vendor, Vendor::Amd);
    assert_eq!(info.ordinal, 1, "the caller's current device, not device 0");
    assert_eq!(info.arch, "gfx942");
    assert_eq!(info.name, "Fake Instinct MI300X (gfx942:sramecc+:xnack-)");
    assert_eq!(info.total_memory, 192 << 30);
    assert_eq!(info.multiprocessors, 304);
    assert_eq!(info.warp_size, 64);
    assert_eq!(info.runtime_version, 60342134);
    assert_eq!(fake(&fakes().gpu6).device_target(1).unwrap(), "gfx942:sramecc+:xnack-");
}

#[test]
fn rocm5_device_info_reads_the_r0000_layout() {
    let info = fake(&fakes().gpu5).current_device().expect("device info");
    assert_eq!(info.arch, "gfx90a");
    assert_eq!(info.name, "Fake Instinct MI250X (gfx90a:sramecc+:xnack-)");
    assert_eq!(info.multiprocessors, 110);
    assert_eq!(info.runtime_version, 50731921);
}

#[test]
fn rocm6_without_r0600_is_refused_rather_than_guessed() {
    match fake(&fakes().odd6).current_device().unwrap_err() {
        DeviceError::Unsupported(text) => assert!(text.contains("hipGetDevicePropertiesR0600"), "{text}"),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Fake library: every argument and constant reaches the C side.

#[test]
fn memory_copies_and_fills_go_through() {
    let rt = fake(&fakes().gpu6);
    let a = rt.malloc(64).unwrap();
    let b = rt.malloc(64).unwrap();
    let data: Vec<u8> = (0..64).collect();
    rt.copy_to_device_sync(a, &data).unwrap();
    rt.copy_async(b, a, 64, Stream(0)).unwrap(); // the fake rejects any kind but DeviceToDevice
    rt.memset_async(b, 0x5a, 8, Stream(0)).unwrap();
    let mut back = vec![0u8; 64];
    rt.copy_to_host_sync(&mut back, b).unwrap();
    assert_eq!(&back[..8], &[0x5a; 8]);
    assert_eq!(&back[8..], &data[8..]);
    // SAFETY: both came from malloc above and are not used again.
    unsafe {
        rt.free(a).unwrap();
        rt.free(b).unwrap();
    }
}

#[test]
fn host_to_device_copies_take_a_non_blocking_stream_of_their_own() {
    // A copy on the null stream would wait for every blocking stream and join a capture on one
    // of them (as CUDA's legacy stream does): the shim's copies take a stream of their own.
    let path = &fakes().gpu6;
    let rt = fake(path);
    let a = rt.malloc(64).unwrap();
    let data: Vec<u8> = (0..64).rev().collect();
    rt.copy_to_device_sync(a, &data).unwrap();
    let mut back = vec![0u8; 64];
    rt.copy_to_host_sync(&mut back, a).unwrap();
    assert_eq!(back, data, "the copy has landed when copy_to_device_sync returns (its stream waited for)");
    // The library is loaded already (RTLD_NOLOAD): the same instance, with the fake's counters.
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; NOLOAD opens nothing new.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "the fake is loaded");
    let symbol = |name: &str| {
        let c_name = CString::new(name).unwrap();
        // SAFETY: a live handle and a valid C string.
        let f = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
        assert!(!f.is_null(), "{name}");
        f
    };
    // SAFETY: the fake's counters, functions of no arguments with these C return types.
    let (null_copies, last_stream) = unsafe {
        let null_copies: unsafe extern "C" fn() -> i32 =
            std::mem::transmute(symbol("fake_htod_null_stream_copies"));
        let last_stream: unsafe extern "C" fn() -> usize =
            std::mem::transmute(symbol("fake_htod_last_stream"));
        (null_copies(), last_stream())
    };
    // SAFETY: the handle from dlopen above; the runtime keeps its own reference.
    unsafe { libc::dlclose(handle) };
    assert_eq!(null_copies, 0, "no host-to-device copy took the null stream (in any test)");
    // The fake's handle encodes the creation: hipStreamNonBlocking (1) and priority 0.
    assert_eq!(last_stream, 0x5000 + 0x100 + 16);
    // SAFETY: from malloc above, not used again.
    unsafe { rt.free(a).unwrap() };
}

// ---------------------------------------------------------------------------------------------
// Fake library: mapped host memory (the results ring) is the runtime's own registered pages.

/// A function the fake exports besides the HIP API, from the copy the runtime loaded.
fn fake_symbol(path: &Path, name: &str) -> *mut c_void {
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; NOLOAD opens nothing new.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "{} is loaded", path.display());
    let c_name = CString::new(name).unwrap();
    // SAFETY: a live handle and a valid C string.
    let f = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    // SAFETY: the handle from dlopen above; the runtime keeps its own reference, so `f` stays valid.
    unsafe { libc::dlclose(handle) };
    assert!(!f.is_null(), "{name}");
    f
}

/// The fake's record of host registration, per calling thread.
struct FakeHost {
    fail: unsafe extern "C" fn(c_int),
    attempt: unsafe extern "C" fn() -> usize,
    attempt_bytes: unsafe extern "C" fn() -> usize,
    registered: unsafe extern "C" fn() -> c_int,
}

impl FakeHost {
    fn of(path: &Path) -> FakeHost {
        // SAFETY: the fake defines these with exactly these C signatures.
        unsafe {
            FakeHost {
                fail: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(fake_symbol(
                    path,
                    "fake_fail_host",
                )),
                attempt: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> usize>(fake_symbol(
                    path,
                    "fake_register_attempt",
                )),
                attempt_bytes: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> usize>(
                    fake_symbol(path, "fake_register_attempt_bytes"),
                ),
                registered: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(fake_symbol(
                    path,
                    "fake_registered_by_thread",
                )),
            }
        }
    }
    /// Arms failures of this thread's next calls: 1 hipHostRegister, 2 hipHostGetDevicePointer,
    /// 4 hipHostUnregister.
    fn fail(&self, which: c_int) {
        // SAFETY: sets a thread-local in the fake.
        unsafe { (self.fail)(which) }
    }
    /// (pointer, bytes) of this thread's last hipHostRegister call; (0, 0) if none.
    fn attempt(&self) -> (usize, usize) {
        // SAFETY: reads thread-locals in the fake.
        unsafe { ((self.attempt)(), (self.attempt_bytes)()) }
    }
    /// Ranges this thread registered and has not unregistered.
    fn registered(&self) -> c_int {
        // SAFETY: reads a thread-local in the fake.
        unsafe { (self.registered)() }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap().max(4096)
}

/// Whether any page of [ptr, ptr + len) is mapped in this process (mincore: ENOMEM on a hole).
/// Only meaningful where no other thread maps memory meanwhile (the child processes).
fn is_mapped(ptr: usize, len: usize) -> bool {
    let mut residency = vec![0u8; len.div_ceil(page_size())];
    // SAFETY: mincore only inspects the page tables and writes one byte per page.
    unsafe { libc::mincore(ptr as *mut c_void, len, residency.as_mut_ptr()) == 0 }
}

#[test]
fn mapped_host_memory_is_the_runtimes_own_registered_pages() {
    let path = &fakes().gpu6;
    let rt = fake(path);
    let host = FakeHost::of(path);
    let page = page_size();
    let before = host.registered();
    // The fake registers only flags 2 (hipHostRegisterMapped) on whole, page-aligned, zeroed pages.
    let mapped = rt.alloc_mapped(page + 1).unwrap();
    assert_eq!(mapped.bytes, page + 1);
    assert_eq!(mapped.host as usize % page, 0);
    assert_eq!(host.attempt(), (mapped.host as usize, 2 * page), "registered in place, whole pages");
    assert_eq!(host.registered(), before + 1);
    assert_eq!(
        mapped.device,
        (mapped.host as u64) ^ (1 << 62),
        "the device address hipHostGetDevicePointer gave"
    );
    // SAFETY: `host` is a live mapping of two pages until free_mapped below, used by no one else.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mapped.host, 2 * page) };
    assert!(bytes.iter().all(|&b| b == 0), "mapped host memory starts zeroed");
    bytes.fill(0x5a);
    // SAFETY: from alloc_mapped above and not used again.
    unsafe { rt.free_mapped(&mapped).unwrap() };
    assert_eq!(host.registered(), before, "unregistered");
    assert!(matches!(rt.alloc_mapped(0), Err(DeviceError::Unsupported(_))));
}

#[test]
fn mapped_host_memory_needs_all_three_registration_calls() {
    // Checked before anything is mapped: pages registered without hipHostUnregister could never
    // be given back.
    assert_eq!(
        fake(&fakes().bare).alloc_mapped(64).unwrap_err(),
        DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipHostRegister" }
    );
    let path = &fakes().no_unregister;
    assert_eq!(
        fake(path).alloc_mapped(64).unwrap_err(),
        DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipHostUnregister" }
    );
    assert_eq!(FakeHost::of(path).attempt(), (0, 0), "hipHostRegister was never called");
}

#[test]
fn failed_set_up_and_teardown_of_mapped_host_memory_leave_nothing_behind() {
    // In a child process: whether an address range is still mapped can only be asked where no
    // other thread maps memory meanwhile.
    run_child("mapped-undo", &[("QS_HIP_CHILD_LIB", &fakes().gpu6)]);
}

/// Child mode `mapped-undo`: every failure of alloc_mapped / free_mapped, one at a time.
fn mapped_undo(path: &Path) {
    let rt = fake(path);
    let host = FakeHost::of(path);
    let page = page_size();

    // hipHostRegister refuses: the pages are unmapped again.
    host.fail(1);
    match rt.alloc_mapped(100).unwrap_err() {
        DeviceError::Call { call: "hipHostRegister", code: 2, .. } => {}
        other => panic!("{other:?}"),
    }
    let (tried, bytes) = host.attempt();
    assert!(tried != 0 && bytes == page, "{tried:#x} {bytes}");
    assert!(!is_mapped(tried, bytes), "unmapped after the failed registration");
    assert_eq!(host.registered(), 0);

    // No device address: unregistered, then unmapped.
    host.fail(2);
    match rt.alloc_mapped(100).unwrap_err() {
        DeviceError::Call { call: "hipHostGetDevicePointer", code: 1, .. } => {}
        other => panic!("{other:?}"),
    }
    let (tried, bytes) = host.attempt();
    assert!(!is_mapped(tried, bytes), "unmapped after the failed set-up");
    assert_eq!(host.registered(), 0, "unregistered after the failed set-up");

    // No device address and HIP refuses to unregister: the pages stay mapped, since HIP may
    // still hold them (and their address range must not be handed out again).
    host.fail(2 | 4);
    assert!(matches!(rt.alloc_mapped(100), Err(DeviceError::Call { call: "hipHostGetDevicePointer", .. })));
    let (tried, bytes) = host.attempt();
    assert!(is_mapped(tried, bytes), "left mapped while registered");

    // Teardown after the registration is gone (a host's hipDeviceReset): an error, and the
    // pages stay readable, as the poller may still read them.
    let mapped = rt.alloc_mapped(100).unwrap();
    host.fail(4);
    // SAFETY: from alloc_mapped above; its memory is only read below, as the poller would.
    let err = unsafe { rt.free_mapped(&mapped) }.unwrap_err();
    assert_eq!(
        err,
        DeviceError::Call {
            call: "hipHostUnregister",
            code: 713,
            message: "hipErrorHostMemoryNotRegistered".into()
        }
    );
    assert!(is_mapped(mapped.host as usize, page));
    // SAFETY: still mapped (checked above) and zeroed at allocation.
    assert_eq!(unsafe { std::ptr::read_volatile(mapped.host) }, 0);

    // Ordinary teardown: unregistered, then unmapped.
    let mapped = rt.alloc_mapped(100).unwrap();
    let before = host.registered();
    // SAFETY: from alloc_mapped above and not used again.
    unsafe { rt.free_mapped(&mapped).unwrap() };
    assert_eq!(host.registered(), before - 1);
    assert!(!is_mapped(mapped.host as usize, page), "unmapped after unregistering");
}

#[test]
fn the_results_ring_lives_in_registered_pages_or_does_not_start() {
    // A library without the registration calls: the ring, so the backend, refuses to start.
    let bare: Arc<dyn GpuRuntime> = Arc::new(fake(&fakes().bare));
    match ResultRing::new(bare, 4) {
        Err(error) => {
            assert_eq!(error, DeviceError::SymbolMissing { lib: "libamdhip64", name: "hipHostRegister" })
        }
        Ok(_) => panic!("a ring without hipHostRegister"),
    }
    let path = &fakes().gpu6;
    let host = FakeHost::of(path);
    let before = host.registered();
    let ring = ResultRing::new(Arc::new(fake(path)), 4).unwrap();
    assert_eq!(host.registered(), before + 1);
    let (registered, _) = host.attempt();
    assert_eq!(ring.desc().header_ptr, registered as u64 ^ (1 << 62), "the ring's header is on those pages");
    drop(ring);
    assert_eq!(host.registered(), before, "unregistered when the ring goes");
}

#[test]
fn host_register_flags_are_pinned_to_the_header_values() {
    let pinned = [
        ("hipHostRegisterDefault", 0),
        ("hipHostRegisterPortable", 1),
        ("hipHostRegisterMapped", 2),
        ("hipHostRegisterIoMemory", 4),
        ("hipHostRegisterReadOnly", 8),
        ("hipExtHostRegisterCoarseGrained", 8),
    ];
    assert_eq!(HipRuntime::host_register_flags(), pinned);
    assert_eq!(HipRuntime::ring_register_flags(), 2, "hipHostRegisterMapped alone: fine-grained");

    // Against the real hip_runtime_api.h, where one is installed.
    let Some(include) = hip_include_dir() else {
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hip-fakes");
    std::fs::create_dir_all(&dir).unwrap();
    let mut source = String::from("#include <hip/hip_runtime_api.h>\n#include <stdio.h>\nint main(void) {\n");
    for (name, _) in HipRuntime::host_register_flags() {
        source.push_str(&format!(
            "#ifdef {name}\n  printf(\"%s %lld\\n\", \"{name}\", (long long)({name}));\n#endif\n"
        ));
    }
    source.push_str("  return 0;\n}\n");
    let src = dir.join(format!("host_register_flags.{}.cpp", std::process::id()));
    let exe = dir.join(format!("host_register_flags.{}", std::process::id()));
    std::fs::write(&src, source).unwrap();
    let output = Command::new("c++")
        .args(["-x", "c++", "-D__HIP_PLATFORM_AMD__", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run c++ (a C++ compiler is needed to check against the installed header)");
    assert!(
        output.status.success(),
        "compiling against {}: {}",
        include.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&exe);
    let text = String::from_utf8(printed.stdout).unwrap();
    let header: Vec<(&str, u32)> = text
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name, value.parse::<u32>().unwrap())
        })
        .collect();
    for (name, value) in &header {
        let ours = pinned.iter().find(|(n, _)| n == name).map(|&(_, v)| v);
        assert_eq!(ours, Some(*value), "{name} in {}", include.display());
    }
    // Every ROCm header since 5.2 has these; hipHostRegisterReadOnly only the newer ones.
    for name in pinned.iter().map(|(n, _)| *n).filter(|n| *n != "hipHostRegisterReadOnly") {
        assert!(header.iter().any(|(n, _)| *n == name), "{name} missing from {}", include.display());
    }
}

/// The include directory holding `hip/hip_runtime_api.h`: `QS_HIP_INCLUDE` (tests only), else
/// `$ROCM_PATH/include`, `/opt/rocm/include`, `/usr/include` (Debian's libamdhip64-dev).
fn hip_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> =
        std::env::var_os("QS_HIP_INCLUDE").map(PathBuf::from).into_iter().collect();
    if let Some(root) = std::env::var_os("ROCM_PATH").filter(|r| !r.is_empty()) {
        candidates.push(Path::new(&root).join("include"));
    }
    candidates.extend(["/opt/rocm/include", "/usr/include"].map(PathBuf::from));
    candidates.into_iter().find(|dir| dir.join("hip/hip_runtime_api.h").is_file())
}

#[test]
fn streams_events_and_capture_status() {
    let rt = fake(&fakes().gpu6);
    // Non-blocking flag (1) and the least priority of the range (3): 0x5000 + 0x100 + (3 + 16).
    assert_eq!(rt.create_side_stream().unwrap(), Stream(0x5000 + 0x100 + 19));
    // hipEventDefault (0): timing stays on.
    let start = rt.create_event().unwrap();
    assert_eq!(start, Event(0x7000));
    rt.record_event(start, Stream(0)).unwrap();
    rt.wait_event(Stream(0), start).unwrap(); // the fake rejects non-zero flags
    assert_eq!(rt.elapsed_ms(Event(0x7000), Event(0x7010)).unwrap(), 4.0);
    // hipEventQuery: success = done, hipErrorNotReady (600) = still running, else an error.
    assert!(rt.event_done(start).unwrap());
    assert!(!rt.event_done(Event(0x7001)).unwrap());
    assert!(rt.event_done(Event(0)).is_err());
    rt.synchronize(Stream(0)).unwrap();

    assert!(!rt.is_capturing(Stream(0)).unwrap(), "hipStreamCaptureStatusNone");
    assert!(rt.is_capturing(Stream(1)).unwrap(), "hipStreamCaptureStatusActive");
    assert!(rt.is_capturing(Stream(2)).unwrap(), "hipStreamCaptureStatusInvalidated");
    assert!(matches!(rt.is_capturing(Stream(7)), Err(DeviceError::Unsupported(_))), "unknown status");
    assert!(matches!(rt.is_capturing(Stream(0xdead)), Err(DeviceError::Call { code: 400, .. })));
}

fn minimal_elf() -> Vec<u8> {
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // ELFCLASS64
    elf[5] = 1; // little-endian
    elf
}

#[test]
fn modules_functions_and_launch_arguments() {
    let rt = fake(&fakes().gpu6);
    let module = rt.load_module(&minimal_elf()).unwrap();
    assert_eq!(module, Module(0x9000));
    assert!(
        matches!(rt.load_module(b"garbage"), Err(DeviceError::Unsupported(_))),
        "checked before HIP reads it"
    );
    assert!(matches!(rt.load_module(&minimal_elf()[..40]), Err(DeviceError::Unsupported(_))));

    let function = rt.get_function(module, "kernel_a").unwrap();
    assert_eq!(function, Function(0x9100));
    match rt.get_function(module, "nope").unwrap_err() {
        DeviceError::Call { call: "hipModuleGetFunction", code: 500, message } => {
            assert_eq!(message, "hipErrorNotFound: fake: named symbol not found")
        }
        other => panic!("{other:?}"),
    }

    let out = rt.malloc(8 * 4).unwrap();
    let mut out_arg = out as usize as *mut u32;
    let mut params = [&mut out_arg as *mut *mut u32 as *mut c_void];
    // SAFETY: kernel_a takes one `unsigned*`; `params[0]` points at one, to 32 writable bytes.
    unsafe {
        rt.launch(function, [2, 3, 4], [64, 1, 2], 128, Stream(0x55), &mut params, LaunchOrder::InOrder)
            .unwrap()
    };
    let mut back = [0u8; 32];
    rt.copy_to_host_sync(&mut back, out).unwrap();
    let values: Vec<u32> = back.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(values, [2, 3, 4, 64, 1, 2, 128, 0x55], "grid, block, shared bytes, stream in order");

    // HIP has no early starts: refused before anything is launched (the output stays as it was).
    assert!(!rt.early_launch());
    rt.copy_to_device_sync(out, &[0u8; 32]).unwrap();
    // SAFETY: as above; the early launch is refused before HIP sees it.
    let early = unsafe {
        rt.launch(function, [5, 1, 1], [32, 1, 1], 0, Stream(0x55), &mut params, LaunchOrder::Early)
    };
    assert!(matches!(early, Err(DeviceError::Unsupported(_))), "{early:?}");
    rt.copy_to_host_sync(&mut back, out).unwrap();
    assert_eq!(back, [0u8; 32], "nothing ran");
    // SAFETY: from malloc above, not used again.
    unsafe { rt.free(out).unwrap() };
}

// ---------------------------------------------------------------------------------------------
// Fake library: hipRTC.

#[test]
fn compile_passes_the_target_first_then_the_options() {
    let rt = fake(&fakes().gpu6);
    assert_eq!(rt.hiprtc_path().unwrap(), rt.library_path(), "hipRTC taken from the HIP library itself");
    let image =
        rt.compile("extern \"C\" __global__ void k() {}", "k.cu", "gfx90a", &["-O3".into()], &[]).unwrap();
    assert_eq!(image, b"\x7fELF--offload-arch=gfx90a|-O3");
}

#[test]
fn compile_failure_keeps_the_log_and_the_options() {
    let rt = fake(&fakes().gpu6);
    match rt.compile("#error no\n", "bad.cu", "gfx90a", &["-O3".into()], &[]).unwrap_err() {
        DeviceError::Compile { name, arch, options, log } => {
            assert_eq!((name.as_str(), arch.as_str()), ("bad.cu", "gfx90a"));
            assert_eq!(options, "--offload-arch=gfx90a -O3");
            assert!(log.contains("error: requested by the test"), "{log}");
            assert!(log.contains("HIPRTC_ERROR_COMPILATION"), "{log}");
        }
        other => panic!("{other:?}"),
    }
    match rt.compile("", "k.cu", "sm_90", &[], &[]).unwrap_err() {
        DeviceError::Compile { log, .. } => assert!(log.contains("not an AMD GPU target"), "{log}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(rt.compile("a\0b", "k.cu", "gfx90a", &[], &[]), Err(DeviceError::Compile { .. })));
}

#[test]
fn compile_without_hiprtc_is_library_missing() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libhiprtc.so.6");
    let options =
        HipLoadOptions { hip_library: Some(fakes().bare.clone()), hiprtc_library: Some(missing.clone()) };
    let rt = HipRuntime::load_with(&options).unwrap();
    for _ in 0..2 {
        // The outcome is kept: the second call gives the same error without searching again.
        match rt.compile("", "k.cu", "gfx90a", &[], &[]).unwrap_err() {
            DeviceError::LibraryMissing { lib: "libhiprtc", searched } => {
                assert!(searched.contains(&missing.display().to_string()), "{searched}")
            }
            other => panic!("{other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loading: overrides, bad files, the environment variable, an already loaded copy.

#[test]
fn override_to_a_missing_file_is_library_missing() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libamdhip64.so");
    let err =
        HipRuntime::load_with(&HipLoadOptions { hip_library: Some(path.clone()), hiprtc_library: None })
            .unwrap_err();
    match err {
        DeviceError::LibraryMissing { lib: "libamdhip64", searched } => {
            assert!(searched.starts_with(&path.display().to_string()), "{searched}");
            assert!(searched.contains("QUANTSHADOW_HIP_LIB"), "{searched}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_library_gives_the_loader_reason() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hip-fakes/libamdhip64-not-elf.so");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    write_atomically(&path, b"this is not an ELF file");
    let err =
        HipRuntime::load_with(&HipLoadOptions { hip_library: Some(path), hiprtc_library: None }).unwrap_err();
    match err {
        DeviceError::LibraryMissing { lib: "libamdhip64", searched } => {
            assert!(searched.contains("load errors:"), "{searched}")
        }
        other => panic!("{other:?}"),
    }
}

/// Runs this test binary again with `mode` and extra environment, expecting it to print
/// `CHILD-OK`: environment variables and process-wide loads stay out of this process.
fn run_child(mode: &str, env: &[(&str, &Path)]) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"]).env("QS_HIP_CHILD", mode);
    command.env_remove("QUANTSHADOW_HIP_LIB").env_remove("QUANTSHADOW_HIPRTC_LIB");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run the test binary as a child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("CHILD-OK {mode}")),
        "child {mode} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

/// Entry point of the child processes above; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var("QS_HIP_CHILD") else {
        return;
    };
    match mode.as_str() {
        "env" => {
            let rt = HipRuntime::load().expect("QUANTSHADOW_HIP_LIB names the fake");
            assert!(rt.library_path().ends_with("libfakehip-gpu6.so"), "{}", rt.library_path());
            assert_eq!(rt.current_device().unwrap().arch, "gfx942");
        }
        "env-missing" => match HipRuntime::load().unwrap_err() {
            DeviceError::LibraryMissing { searched, .. } => {
                assert!(searched.contains("no-such-dir"), "{searched}")
            }
            other => panic!("{other:?}"),
        },
        "loaded" => {
            // The engine loaded its HIP runtime under a libamdhip64 soname before us.
            let path = std::env::var("QS_HIP_CHILD_LIB").unwrap();
            let c_path = CString::new(path.clone()).unwrap();
            // SAFETY: loads a fake library whose initialisers do nothing; never closed.
            let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!handle.is_null(), "dlopen {path}");
            let rt = HipRuntime::load_with(&HipLoadOptions::default()).expect("finds the loaded copy");
            assert_eq!(rt.library_path(), path, "the copy already in the process, not a system one");
        }
        "mapped-undo" => mapped_undo(Path::new(&std::env::var("QS_HIP_CHILD_LIB").unwrap())),
        other => panic!("unknown child mode {other}"),
    }
    println!("CHILD-OK {mode}");
}

#[test]
fn environment_variable_selects_the_library() {
    run_child("env", &[("QUANTSHADOW_HIP_LIB", &fakes().gpu6)]);
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libamdhip64.so.6");
    run_child("env-missing", &[("QUANTSHADOW_HIP_LIB", &missing)]);
}

#[test]
fn a_copy_already_loaded_by_the_process_is_preferred() {
    // Same bytes as the ROCm 6 fake, under a name the scan recognises.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hip-fakes/loaded");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libamdhip64.so.99");
    write_atomically(&path, &std::fs::read(&fakes().gpu6).unwrap());
    run_child("loaded", &[("QS_HIP_CHILD_LIB", &path)]);
}

// ---------------------------------------------------------------------------------------------
// The real library, present or absent.

/// Whether a HIP runtime can be opened, found the way production code documents it, but with
/// plain `dlopen` calls: the test's own answer to "is libamdhip64 installed here".
fn real_hip_installed() -> bool {
    let root =
        std::env::var("ROCM_PATH").ok().filter(|r| !r.is_empty()).unwrap_or_else(|| "/opt/rocm".into());
    let names = [
        "libamdhip64.so".to_string(),
        "libamdhip64.so.7".into(),
        "libamdhip64.so.6".into(),
        "libamdhip64.so.5".into(),
        format!("{root}/lib/libamdhip64.so"),
    ];
    names.iter().any(|name| {
        let c_name = CString::new(name.as_str()).unwrap();
        // SAFETY: loading the vendor library runs only its initialisers; it is never closed.
        !unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
    })
}

/// Whether hipRTC can be had for the real runtime: inside libamdhip64 (ROCm <= 5.2) or as
/// libhiprtc.
fn real_hiprtc_installed(hip_path: &str) -> bool {
    let c_hip = CString::new(hip_path).unwrap();
    // SAFETY: the library is already loaded; this only takes another reference.
    let handle = unsafe { libc::dlopen(c_hip.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    // SAFETY: a live handle and a NUL-terminated name.
    let inside =
        !handle.is_null() && !unsafe { libc::dlsym(handle, c"hiprtcCreateProgram".as_ptr()) }.is_null();
    let dir = Path::new(hip_path).parent().map(Path::to_path_buf).unwrap_or_default();
    inside
        || ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"].iter().any(|name| {
            [dir.join(name), PathBuf::from(name)].iter().any(|candidate| {
                let c_name = CString::new(candidate.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: as in real_hip_installed.
                !unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
            })
        })
}

fn amd_gpu_present() -> bool {
    Path::new("/dev/kfd").exists()
}

#[test]
fn real_library_loads_or_is_reported_missing() {
    let result = HipRuntime::load_with(&HipLoadOptions::default());
    if real_hip_installed() {
        let rt = result.expect("libamdhip64 is installed, so load must succeed");
        assert!(rt.library_path().contains("libamdhip64.so"), "{}", rt.library_path());
        assert_eq!(rt.vendor(), Vendor::Amd);
    } else {
        match result.unwrap_err() {
            DeviceError::LibraryMissing { lib: "libamdhip64", searched } => {
                for name in [
                    "libamdhip64.so,",
                    "libamdhip64.so.7",
                    "libamdhip64.so.6",
                    "libamdhip64.so.5",
                    "/lib/libamdhip64.so",
                ] {
                    assert!(searched.contains(name), "{name} not in {searched}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn real_library_without_a_gpu_says_no_device() {
    if !real_hip_installed() {
        return; // covered by real_library_loads_or_is_reported_missing
    }
    let rt = HipRuntime::load_with(&HipLoadOptions::default()).unwrap();
    match rt.current_device() {
        Ok(info) => {
            assert!(amd_gpu_present(), "device info without /dev/kfd: {info:?}");
            assert!(
                info.arch.starts_with("gfx") && info.multiprocessors > 0 && info.total_memory > 0,
                "{info:?}"
            );
        }
        Err(DeviceError::NoDevice { vendor: "AMD", detail }) => {
            assert!(!amd_gpu_present(), "NoDevice with /dev/kfd present: {detail}");
        }
        Err(other) => panic!("{other}"),
    }
    if !amd_gpu_present() {
        // Everything that needs a device fails cleanly.
        assert!(rt.malloc(256).is_err());
        // The registration fails (ROCm 5.2.3: hipErrorInvalidDevice) and its pages are unmapped.
        let mapped = rt.alloc_mapped(256);
        assert!(
            matches!(
                mapped,
                Err(DeviceError::Call { call: "hipHostRegister" | "hipHostGetDevicePointer", .. })
            ),
            "{:?}",
            mapped.map(|m| m.bytes)
        );
        assert!(rt.create_side_stream().is_err());
        assert!(rt.load_module(&minimal_elf()).is_err());
    }
}

#[test]
fn real_hiprtc_compiles_without_a_gpu() {
    if !real_hip_installed() {
        return; // covered by real_library_loads_or_is_reported_missing
    }
    let rt = HipRuntime::load_with(&HipLoadOptions::default()).unwrap();
    let source = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";
    let result = rt.compile(source, "twice.cu", "gfx90a", &["-O3".into()], &[]);
    if !real_hiprtc_installed(rt.library_path()) {
        assert!(matches!(result, Err(DeviceError::LibraryMissing { lib: "libhiprtc", .. })), "{result:?}");
        return;
    }
    let image = result.expect("hipRTC compiles for gfx90a without a device");
    assert_eq!(&image[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([image[18], image[19]]), 224, "e_machine EM_AMDGPU");
    // EF_AMDGPU_MACH (the low byte of e_flags) 0x3f is gfx90a (LLVM's ELF.h).
    assert_eq!(image[0x30], 0x3f, "e_flags mach");
    assert!(image.windows(6).any(|w| w == b"twice\0"), "kernel symbol in the code object");

    match rt.compile("__global__ void f() { syntax error }", "bad.cu", "gfx90a", &[], &[]).unwrap_err() {
        DeviceError::Compile { log, options, .. } => {
            assert!(log.contains("error"), "{log}");
            assert_eq!(options, "--offload-arch=gfx90a");
        }
        other => panic!("{other:?}"),
    }

    // A well-formed target no compiler knows: refused with the list of known targets (ROCm
    // 5.2's hipRTC aborts the process if asked to compile for it).
    match rt.compile(source, "twice.cu", "gfx9999", &[], &[]).unwrap_err() {
        DeviceError::Compile { log, .. } => assert!(log.contains("gfx9999"), "{log}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn real_hiprtc_serves_in_memory_headers() {
    if !real_hip_installed() {
        return; // covered by real_library_loads_or_is_reported_missing
    }
    let rt = HipRuntime::load_with(&HipLoadOptions::default()).unwrap();
    if !real_hiprtc_installed(rt.library_path()) {
        return;
    }
    let source = "#include \"qs_twice.h\"\nextern \"C\" __global__ void twice(float* x) { x[threadIdx.x] = TWICE(x[threadIdx.x]); }";
    let headers = [("qs_twice.h", "#define TWICE(v) ((v) * 2.0f)\n")];
    let image = rt
        .compile(source, "twice.cu", "gfx90a", &["-O3".into()], &headers)
        .expect("header served from memory");
    assert!(image.starts_with(b"\x7fELF") || !image.is_empty());
    // Without the header the same source does not compile: the header really came from memory.
    assert!(matches!(rt.compile(source, "twice.cu", "gfx90a", &[], &[]), Err(DeviceError::Compile { .. })));
}
