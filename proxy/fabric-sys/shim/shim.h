/*
 * cpnet libfabric shim.
 *
 * libfabric implements most of its API as `static inline` functions that jump
 * through per-object ops tables (see rdma/fi_*.h). Those have no symbol in
 * libfabric.so, so Rust cannot link to them. This header declares one real,
 * exported wrapper per inline call, named `cpnet_fi_<name>`, with exactly the
 * same signature; shim.c defines each as a one-line forward.
 *
 * This header is also the input of bindgen (build.rs), so it includes every
 * libfabric header the bindings cover.
 */
#ifndef CPNET_FABRIC_SHIM_H
#define CPNET_FABRIC_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fabric.h */
struct fi_info *cpnet_fi_allocinfo(void);
int cpnet_fi_close(struct fid *fid);
int cpnet_fi_control(struct fid *fid, int command, void *arg);

/* fi_domain.h */
int cpnet_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
		    struct fid_domain **domain, void *context);
int cpnet_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
		     struct fid_cq **cq, void *context);
int cpnet_fi_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr,
		       struct fid_cntr **cntr, void *context);
int cpnet_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
		     struct fid_av **av, void *context);
int cpnet_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
		       fi_addr_t *fi_addr, uint64_t flags, void *context);
const char *cpnet_fi_av_straddr(struct fid_av *av, const void *addr,
				char *buf, size_t *len);
int cpnet_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		    uint64_t acs, uint64_t offset, uint64_t requested_key,
		    uint64_t flags, struct fid_mr **mr, void *context);
void *cpnet_fi_mr_desc(struct fid_mr *mr);
uint64_t cpnet_fi_mr_key(struct fid_mr *mr);
int cpnet_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int cpnet_fi_mr_enable(struct fid_mr *mr);
int cpnet_fi_query_atomic(struct fid_domain *domain, enum fi_datatype datatype,
			  enum fi_op op, struct fi_atomic_attr *attr,
			  uint64_t flags);

/* fi_endpoint.h, fi_cm.h */
int cpnet_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
		      struct fid_ep **ep, void *context);
int cpnet_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int cpnet_fi_enable(struct fid_ep *ep);
int cpnet_fi_getname(fid_t fid, void *addr, size_t *addrlen);

/* fi_endpoint.h: messages */
ssize_t cpnet_fi_send(struct fid_ep *ep, const void *buf, size_t len,
		      void *desc, fi_addr_t dest_addr, void *context);
ssize_t cpnet_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		      fi_addr_t src_addr, void *context);

/* fi_rma.h */
ssize_t cpnet_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		      fi_addr_t src_addr, uint64_t addr, uint64_t key,
		      void *context);
ssize_t cpnet_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
			 uint64_t flags);
ssize_t cpnet_fi_write(struct fid_ep *ep, const void *buf, size_t len,
		       void *desc, fi_addr_t dest_addr, uint64_t addr,
		       uint64_t key, void *context);
ssize_t cpnet_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
			  uint64_t flags);
ssize_t cpnet_fi_inject_write(struct fid_ep *ep, const void *buf, size_t len,
			      fi_addr_t dest_addr, uint64_t addr, uint64_t key);

/* fi_atomic.h */
ssize_t cpnet_fi_atomic(struct fid_ep *ep, const void *buf, size_t count,
			void *desc, fi_addr_t dest_addr, uint64_t addr,
			uint64_t key, enum fi_datatype datatype, enum fi_op op,
			void *context);
ssize_t cpnet_fi_atomicmsg(struct fid_ep *ep, const struct fi_msg_atomic *msg,
			   uint64_t flags);
ssize_t cpnet_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count,
			      void *desc, void *result, void *result_desc,
			      fi_addr_t dest_addr, uint64_t addr, uint64_t key,
			      enum fi_datatype datatype, enum fi_op op,
			      void *context);
ssize_t cpnet_fi_fetch_atomicmsg(struct fid_ep *ep,
				 const struct fi_msg_atomic *msg,
				 struct fi_ioc *resultv, void **result_desc,
				 size_t result_count, uint64_t flags);
ssize_t cpnet_fi_compare_atomic(struct fid_ep *ep, const void *buf,
				size_t count, void *desc, const void *compare,
				void *compare_desc, void *result,
				void *result_desc, fi_addr_t dest_addr,
				uint64_t addr, uint64_t key,
				enum fi_datatype datatype, enum fi_op op,
				void *context);
int cpnet_fi_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
			 enum fi_op op, size_t *count);
int cpnet_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
			       enum fi_op op, size_t *count);
int cpnet_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
				 enum fi_op op, size_t *count);

/* fi_eq.h */
ssize_t cpnet_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t cpnet_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
			    uint64_t flags);
const char *cpnet_fi_cq_strerror(struct fid_cq *cq, int prov_errno,
				 const void *err_data, char *buf, size_t len);
uint64_t cpnet_fi_cntr_read(struct fid_cntr *cntr);
uint64_t cpnet_fi_cntr_readerr(struct fid_cntr *cntr);
int cpnet_fi_cntr_add(struct fid_cntr *cntr, uint64_t value);
int cpnet_fi_cntr_set(struct fid_cntr *cntr, uint64_t value);
int cpnet_fi_cntr_wait(struct fid_cntr *cntr, uint64_t threshold, int timeout);

#ifdef __cplusplus
}
#endif

#endif /* CPNET_FABRIC_SHIM_H */
