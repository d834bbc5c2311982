import re, sys
src = open('../Mamba2.cu').read()
n0 = src.count('extern __shared__ float smem[];')
src = src.replace('extern __shared__ float smem[];', 'float *smem = static_cast<float *>(emu::dynamicShared());')
pat = re.compile(r'(\w+)<<<(.+?)>>>\((.*?)\);', re.S)
count = len(pat.findall(src))
src = pat.sub(lambda m: 'emu::launch(reinterpret_cast<const void *>(&%s), %s, [&] { %s(%s); });' % (m.group(1), m.group(2), m.group(1), m.group(3)), src)
src += '''
namespace emu {
inline bool barrierFree(const void *kernel) {
  using namespace moec::runtime::cuda;
  for (const void *k : {reinterpret_cast<const void *>(&convKernel), reinterpret_cast<const void *>(&timeStepKernel),
                        reinterpret_cast<const void *>(&normWeightGradKernel), reinterpret_cast<const void *>(&activationGradKernel),
                        reinterpret_cast<const void *>(&convInputGradKernel), reinterpret_cast<const void *>(&convParamGradKernel)})
    if (k == kernel)
      return true;
  return false;
}
}
'''
open('Mamba2Emu.cpp', 'w').write(src)
print('shared', n0, 'launches', count)
t = open('../Mamba2Test.cpp').read().replace('runtime/kernels/testing/CudaCompare.h', 'runtime/kernels/cuda/mamba/tmp_emul/CudaCompare.h')
open('Mamba2EmuTest.cpp', 'w').write(t)
c = open('../../../testing/CudaCompare.cpp').read().replace('runtime/kernels/testing/CudaCompare.h', 'runtime/kernels/cuda/mamba/tmp_emul/CudaCompare.h')
open('CudaCompare.cpp', 'w').write(c)
open('CudaCompare.h', 'w').write(open('../../../testing/CudaCompare.h').read())
