/*
 * One exported forward per libfabric `static inline` call; see shim.h.
 * Nothing here may add behaviour: every function is a single return.
 */
#include "shim.h"

/* The Rust side (src/lib.rs) spells these out because bindgen cannot
 * evaluate a cast in a macro; keep the two in step. */
_Static_assert(FI_ADDR_UNSPEC == UINT64_MAX, "FI_ADDR_UNSPEC changed");
_Static_assert(FI_ADDR_NOTAVAIL == UINT64_MAX, "FI_ADDR_NOTAVAIL changed");
_Static_assert(FI_KEY_NOTAVAIL == UINT64_MAX, "FI_KEY_NOTAVAIL changed");
_Static_assert(FI_SHARED_CONTEXT == SIZE_MAX, "FI_SHARED_CONTEXT changed");
_Static_assert(FI_VERSION(1, 17) == 0x10011, "FI_VERSION encoding changed");

/* fabric.h */
struct fi_info *cpnet_fi_allocinfo(void) { return fi_allocinfo(); }
int cpnet_fi_close(struct fid *fid) { return fi_close(fid); }
int cpnet_fi_control(struct fid *fid, int command, void *arg)
{
	return fi_control(fid, command, arg);
}

/* fi_domain.h */
int cpnet_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
		    struct fid_domain **domain, void *context)
{
	return fi_domain(fabric, info, domain, context);
}

int cpnet_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
		     struct fid_cq **cq, void *context)
{
	return fi_cq_open(domain, attr, cq, context);
}

int cpnet_fi_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr,
		       struct fid_cntr **cntr, void *context)
{
	return fi_cntr_open(domain, attr, cntr, context);
}

int cpnet_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
		     struct fid_av **av, void *context)
{
	return fi_av_open(domain, attr, av, context);
}

int cpnet_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
		       fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	return fi_av_insert(av, addr, count, fi_addr, flags, context);
}

const char *cpnet_fi_av_straddr(struct fid_av *av, const void *addr,
				char *buf, size_t *len)
{
	return fi_av_straddr(av, addr, buf, len);
}

int cpnet_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		    uint64_t acs, uint64_t offset, uint64_t requested_key,
		    uint64_t flags, struct fid_mr **mr, void *context)
{
	return fi_mr_reg(domain, buf, len, acs, offset, requested_key, flags,
			 mr, context);
}

void *cpnet_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t cpnet_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }

int cpnet_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags)
{
	return fi_mr_bind(mr, bfid, flags);
}

int cpnet_fi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }

int cpnet_fi_query_atomic(struct fid_domain *domain, enum fi_datatype datatype,
			  enum fi_op op, struct fi_atomic_attr *attr,
			  uint64_t flags)
{
	return fi_query_atomic(domain, datatype, op, attr, flags);
}

/* fi_endpoint.h, fi_cm.h */
int cpnet_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
		      struct fid_ep **ep, void *context)
{
	return fi_endpoint(domain, info, ep, context);
}

int cpnet_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags)
{
	return fi_ep_bind(ep, bfid, flags);
}

int cpnet_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }

int cpnet_fi_getname(fid_t fid, void *addr, size_t *addrlen)
{
	return fi_getname(fid, addr, addrlen);
}

/* fi_endpoint.h: messages */
ssize_t cpnet_fi_send(struct fid_ep *ep, const void *buf, size_t len,
		      void *desc, fi_addr_t dest_addr, void *context)
{
	return fi_send(ep, buf, len, desc, dest_addr, context);
}

ssize_t cpnet_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		      fi_addr_t src_addr, void *context)
{
	return fi_recv(ep, buf, len, desc, src_addr, context);
}

/* fi_rma.h */
ssize_t cpnet_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		      fi_addr_t src_addr, uint64_t addr, uint64_t key,
		      void *context)
{
	return fi_read(ep, buf, len, desc, src_addr, addr, key, context);
}

ssize_t cpnet_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
			 uint64_t flags)
{
	return fi_readmsg(ep, msg, flags);
}

ssize_t cpnet_fi_write(struct fid_ep *ep, const void *buf, size_t len,
		       void *desc, fi_addr_t dest_addr, uint64_t addr,
		       uint64_t key, void *context)
{
	return fi_write(ep, buf, len, desc, dest_addr, addr, key, context);
}

ssize_t cpnet_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
			  uint64_t flags)
{
	return fi_writemsg(ep, msg, flags);
}

ssize_t cpnet_fi_inject_write(struct fid_ep *ep, const void *buf, size_t len,
			      fi_addr_t dest_addr, uint64_t addr, uint64_t key)
{
	return fi_inject_write(ep, buf, len, dest_addr, addr, key);
}

/* fi_atomic.h */
ssize_t cpnet_fi_atomic(struct fid_ep *ep, const void *buf, size_t count,
			void *desc, fi_addr_t dest_addr, uint64_t addr,
			uint64_t key, enum fi_datatype datatype, enum fi_op op,
			void *context)
{
	return fi_atomic(ep, buf, count, desc, dest_addr, addr, key, datatype,
			 op, context);
}

ssize_t cpnet_fi_atomicmsg(struct fid_ep *ep, const struct fi_msg_atomic *msg,
			   uint64_t flags)
{
	return fi_atomicmsg(ep, msg, flags);
}

ssize_t cpnet_fi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count,
			      void *desc, void *result, void *result_desc,
			      fi_addr_t dest_addr, uint64_t addr, uint64_t key,
			      enum fi_datatype datatype, enum fi_op op,
			      void *context)
{
	return fi_fetch_atomic(ep, buf, count, desc, result, result_desc,
			       dest_addr, addr, key, datatype, op, context);
}

ssize_t cpnet_fi_fetch_atomicmsg(struct fid_ep *ep,
				 const struct fi_msg_atomic *msg,
				 struct fi_ioc *resultv, void **result_desc,
				 size_t result_count, uint64_t flags)
{
	return fi_fetch_atomicmsg(ep, msg, resultv, result_desc, result_count,
				  flags);
}

ssize_t cpnet_fi_compare_atomic(struct fid_ep *ep, const void *buf,
				size_t count, void *desc, const void *compare,
				void *compare_desc, void *result,
				void *result_desc, fi_addr_t dest_addr,
				uint64_t addr, uint64_t key,
				enum fi_datatype datatype, enum fi_op op,
				void *context)
{
	return fi_compare_atomic(ep, buf, count, desc, compare, compare_desc,
				 result, result_desc, dest_addr, addr, key,
				 datatype, op, context);
}

int cpnet_fi_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
			 enum fi_op op, size_t *count)
{
	return fi_atomicvalid(ep, datatype, op, count);
}

int cpnet_fi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
			       enum fi_op op, size_t *count)
{
	return fi_fetch_atomicvalid(ep, datatype, op, count);
}

int cpnet_fi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
				 enum fi_op op, size_t *count)
{
	return fi_compare_atomicvalid(ep, datatype, op, count);
}

/* fi_eq.h */
ssize_t cpnet_fi_cq_read(struct fid_cq *cq, void *buf, size_t count)
{
	return fi_cq_read(cq, buf, count);
}

ssize_t cpnet_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
			    uint64_t flags)
{
	return fi_cq_readerr(cq, buf, flags);
}

const char *cpnet_fi_cq_strerror(struct fid_cq *cq, int prov_errno,
				 const void *err_data, char *buf, size_t len)
{
	return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}

uint64_t cpnet_fi_cntr_read(struct fid_cntr *cntr) { return fi_cntr_read(cntr); }

uint64_t cpnet_fi_cntr_readerr(struct fid_cntr *cntr)
{
	return fi_cntr_readerr(cntr);
}

int cpnet_fi_cntr_add(struct fid_cntr *cntr, uint64_t value)
{
	return fi_cntr_add(cntr, value);
}

int cpnet_fi_cntr_set(struct fid_cntr *cntr, uint64_t value)
{
	return fi_cntr_set(cntr, value);
}

int cpnet_fi_cntr_wait(struct fid_cntr *cntr, uint64_t threshold, int timeout)
{
	return fi_cntr_wait(cntr, threshold, timeout);
}
